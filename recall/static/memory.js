// The memory page: plain JavaScript, no build step, nothing fetched from elsewhere.
//
// Rules this file keeps (the page's Content-Security-Policy enforces the first two):
// - no markup is ever built from a string: every element is made with createElement, and every
//   piece of data (conversation text, queries, ids, dates) goes in as text (append of a string
//   makes a Text node; textContent); no innerHTML, insertAdjacentHTML or document.write;
// - no inline code: this file is the page's only script;
// - the token lives in sessionStorage only (gone when the tab closes) and travels only in the
//   Authorization header of requests to this server; no token, user id or query in any URL
//   (the #fragment holds at most the person's own conversation id, and never leaves the browser).
"use strict";

(() => {
  const TOKEN_KEY = "recall.token";
  const VIEWS = ["signin", "conversations", "conversation", "search", "audit", "erase"];
  const ERASE_WORD = "erase";
  const SPEAKERS = { user: "You", assistant: "Assistant", system: "System", tool: "Tool" };
  const OUTCOMES = {
    nothing_found: "Nothing relevant was found.",
    no_memory: "No conversations were stored yet.",
    unavailable: "Your memory was unavailable at that moment; nothing was given.",
    not_yet: "Your conversations were still being indexed; nothing was given.",
  };

  const $ = (id) => document.getElementById(id);
  let current = null; // the conversation on screen: {id, title}
  let loaded = false; // the first view leaves focus where the browser put it (the skip link first)

  class SignedOut extends Error {}

  // An element with attributes (names from this file only) and children; a string child becomes
  // a Text node, never markup.
  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      node.setAttribute(name, value);
    }
    node.append(...children.filter((child) => child !== null && child !== undefined));
    return node;
  }

  function clear(node) {
    node.replaceChildren();
  }

  // "2026-10-08T09:05:00Z" -> "2026-10-08 09:05 UTC" (the dates the assistant sees, too).
  function when(ts) {
    const match = /^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2})/.exec(ts || "");
    return match ? `${match[1]} ${match[2]} UTC` : String(ts || "");
  }

  function plural(count, word) {
    return `${count} ${word}${count === 1 ? "" : "s"}`;
  }

  function conversationLink(conversationId, seq) {
    const target = seq === undefined ? "" : `/${encodeURIComponent(seq)}`;
    return `#conversation/${encodeURIComponent(conversationId)}${target}`;
  }

  function say(message) {
    $("status").textContent = message;
  }

  // --- the server -----------------------------------------------------------------------------

  async function api(method, path, body) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (!token) throw new SignedOut();
    const init = {
      method,
      headers: { Authorization: `Bearer ${token}` },
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    let data = {};
    try {
      data = await response.json();
    } catch {
      data = {};
    }
    if (response.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      throw new SignedOut();
    }
    if (!response.ok) {
      const failure = new Error(data.error || `The server answered ${response.status}.`);
      failure.status = response.status;
      throw failure;
    }
    return data;
  }

  // --- views ----------------------------------------------------------------------------------

  function show(name, { keepReceipt = false } = {}) {
    for (const view of VIEWS) $(`view-${view}`).hidden = view !== name;
    if (!keepReceipt) $("receipt").hidden = true;
    const signedIn = name !== "signin";
    $("nav").hidden = !signedIn;
    $("who").hidden = !signedIn;
    for (const link of $("nav").querySelectorAll("a")) {
      if (link.getAttribute("href") === `#${name}`) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    const heading = $(`view-${name}`).querySelector("h2");
    document.title = `${heading.textContent} · Your memory`;
    if (!keepReceipt && loaded) heading.focus(); // where a screen reader user goes on from
    loaded = true;
  }

  function showReceipt(receipt, summary) {
    $("receipt-summary").textContent = summary;
    const details = $("receipt-details");
    clear(details);
    const removed = receipt.removed || {};
    const rows = [
      ["Receipt", receipt.receipt],
      ["Operation", receipt.operation],
      ["When", when(receipt.at)],
      ["Conversation", receipt.conversation_id],
      ["Conversations removed", removed.conversations],
      ["Turns removed", removed.turns],
      ["Index entries removed", removed.index_rows === null ? "not counted" : removed.index_rows],
    ];
    for (const [term, value] of rows) {
      if (value === undefined) continue;
      details.append(el("dt", {}, term), el("dd", {}, String(value)));
    }
    $("receipt").hidden = false;
    $("receipt-title").focus();
  }

  async function showConversations(options) {
    const { conversations } = await api("GET", "/api/me/conversations");
    const list = $("conversation-list");
    clear(list);
    for (const item of conversations) {
      const link = el(
        "a",
        { href: conversationLink(item.conversation_id) },
        el("span", { class: "date" }, when(item.date)),
        el("span", { class: "first-line" }, item.first_line || item.conversation_id),
      );
      list.append(el("li", { class: "card" }, link, el("span", { class: "count" }, plural(item.turns, "turn"))));
    }
    if (!conversations.length) {
      list.append(el("li", { class: "empty" }, "No conversations are stored for you."));
    }
    show("conversations", options);
  }

  async function openConversation(conversationId, seq) {
    let data;
    try {
      data = await api("POST", "/api/me/conversation", { conversation_id: conversationId });
    } catch (failure) {
      if (failure.status !== 404) throw failure;
      await showConversations();
      say("That conversation is not stored (it may have been forgotten).");
      return;
    }
    const turns = data.turns;
    const first = turns.find((turn) => turn.text.trim());
    const title = first ? first.text.trim().split("\n")[0] : conversationId;
    current = { id: conversationId, title };
    $("conversation-title").textContent = title.length > 120 ? `${title.slice(0, 119)}…` : title;
    const span = turns.length ? `${when(turns[0].ts)} to ${when(turns[turns.length - 1].ts)}` : "";
    $("conversation-meta").textContent = `${plural(turns.length, "turn")}, ${span}. Id: ${conversationId}`;
    const list = $("turn-list");
    clear(list);
    for (const turn of turns) {
      const speaker = SPEAKERS[turn.role] || turn.role;
      const label = turn.recalled ? `${speaker} (answered from recall)` : speaker;
      list.append(
        el(
          "li",
          { class: `turn role-${turn.role in SPEAKERS ? turn.role : "other"}`, id: `turn-${turn.seq}`, tabindex: "-1" },
          el("p", { class: "speaker" }, el("strong", {}, label), " · ", el("time", { datetime: turn.ts }, when(turn.ts))),
          el("p", { class: "text" }, turn.text),
        ),
      );
    }
    show("conversation");
    const target = seq === undefined ? null : $(`turn-${seq}`);
    if (target) {
      target.classList.add("target");
      target.focus();
      target.scrollIntoView({ block: "center" });
    }
  }

  // The query's words, for highlighting: split on spaces, outer punctuation dropped.
  function queryTerms(query) {
    return query
      .split(/\s+/)
      .map((word) => word.replace(/^[^\p{L}\p{N}]+|[^\p{L}\p{N}]+$/gu, ""))
      .filter((word) => word.length >= 2);
  }

  // Text with the terms marked: Text nodes and <mark> elements, never markup.
  function highlighted(text, terms) {
    const node = el("p", { class: "text" });
    if (!terms.length) {
      node.append(text);
      return node;
    }
    const escaped = terms.map((term) => term.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    const pattern = new RegExp(`(${escaped.join("|")})`, "giu");
    text.split(pattern).forEach((part, index) => {
      if (part) node.append(index % 2 ? el("mark", {}, part) : part);
    });
    return node;
  }

  function passageLinks(turns, label) {
    if (!turns.length) return el("span", { class: "gone" }, `${label} (no longer stored)`);
    const links = el("span", { class: "links" });
    turns.forEach((turn, index) => {
      if (index) links.append(", ");
      links.append(el("a", { href: conversationLink(turn.conversation_id, turn.seq) }, label));
    });
    return links;
  }

  async function search(query) {
    const data = await api("POST", "/api/me/search", { query });
    const list = $("search-results");
    clear(list);
    const answer = $("search-answer");
    answer.hidden = data.passages.length > 0;
    answer.textContent = data.passages.length ? "" : data.answer;
    const terms = queryTerms(data.query);
    for (const passage of data.passages) {
      const [header, ...rest] = passage.text.split("\n");
      list.append(
        el(
          "li",
          { class: "card passage" },
          el("p", { class: "passage-head" }, el("strong", {}, header), " ", passageLinks(passage.turns, "Open the conversation")),
          highlighted(rest.join("\n"), terms),
        ),
      );
    }
    say(data.passages.length ? `${plural(data.passages.length, "passage")} found.` : data.answer);
  }

  let auditNext = null; // where the next page of the audit starts (null: none)

  function auditEntry(entry) {
    const served = el("ul", { class: "served" });
    for (const hit of entry.served) {
      const label = hit.role ? `${when(hit.ts)}, ${SPEAKERS[hit.role] || hit.role}` : when(hit.ts);
      served.append(el("li", {}, passageLinks(hit.turns, label)));
    }
    const outcome =
      entry.outcome === "passages" ? `Given ${plural(entry.served.length, "passage")}:` : OUTCOMES[entry.outcome] || entry.outcome;
    return el(
      "li",
      { class: "card" },
      el("p", { class: "passage-head" }, el("time", { datetime: entry.at }, when(entry.at)), " · ", "client ", el("code", {}, entry.client || "unknown")),
      el("p", {}, "Searched for ", el("q", {}, entry.query)),
      el("p", {}, outcome),
      entry.served.length ? served : null,
    );
  }

  // One page of the audit, appended to the list; the server bounds a page, the button asks for
  // the next one.
  async function loadAudit(before) {
    const path = before === null ? "/api/me/audit" : `/api/me/audit?before=${encodeURIComponent(before)}`;
    const { entries, next } = await api("GET", path);
    $("audit-list").append(...entries.map(auditEntry));
    auditNext = next === undefined ? null : next;
    $("audit-more").hidden = auditNext === null;
    return entries.length;
  }

  async function showAudit() {
    const list = $("audit-list");
    clear(list);
    if (!(await loadAudit(null))) {
      list.append(el("li", { class: "empty" }, "Your assistant has not looked anything up yet."));
    }
    show("audit");
  }

  // --- routing and events ---------------------------------------------------------------------

  async function route() {
    say("");
    if (!sessionStorage.getItem(TOKEN_KEY)) {
      show("signin");
      return;
    }
    const [name, ...rest] = location.hash.slice(1).split("/");
    try {
      if (name === "conversation" && rest[0]) {
        await openConversation(decodeURIComponent(rest[0]), rest[1] === undefined ? undefined : decodeURIComponent(rest[1]));
      } else if (name === "search") {
        show("search");
      } else if (name === "audit") {
        await showAudit();
      } else if (name === "erase") {
        show("erase");
      } else {
        await showConversations();
      }
    } catch (failure) {
      failed(failure);
    }
  }

  function failed(failure) {
    if (failure instanceof SignedOut) {
      show("signin");
      say("Please sign in: your token was refused or has expired.");
    } else {
      say(failure.message || "Something went wrong.");
    }
  }

  async function signIn(token) {
    sessionStorage.setItem(TOKEN_KEY, token);
    const { user } = await api("GET", "/api/me");
    $("who").textContent = `Signed in as ${user}`;
  }

  $("signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const input = $("token");
    const token = input.value.trim();
    input.value = "";
    if (!token) return;
    try {
      await signIn(token);
      await route(); // where the address points (the conversations, by default)
    } catch (failure) {
      show("signin");
      say(failure instanceof SignedOut ? "That token was not accepted." : failure.message);
    }
  });

  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $("who").textContent = "";
    current = null;
    history.replaceState(null, "", location.pathname);
    show("signin");
    say("Signed out.");
  });

  $("search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    say("Searching…");
    search($("query").value).catch(failed);
  });

  $("forget-button").addEventListener("click", () => {
    if (!current) return;
    $("forget-dialog-text").textContent = `“${current.title}”`;
    $("forget-dialog").returnValue = "";
    $("forget-dialog").showModal();
  });

  $("forget-dialog").addEventListener("close", async () => {
    if ($("forget-dialog").returnValue !== "forget" || !current) return;
    const { id, title } = current;
    try {
      const receipt = await api("POST", "/api/me/forget", { conversation_id: id });
      current = null;
      history.replaceState(null, "", "#conversations"); // no hashchange: the receipt stays
      await showConversations({ keepReceipt: true });
      say("Forgotten.");
      showReceipt(receipt, `Forgotten: “${title}”. It is gone from your memory and from your assistant's search.`);
    } catch (failure) {
      failed(failure);
    }
  });

  $("erase-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const input = $("erase-word");
    if (input.value.trim() !== ERASE_WORD) {
      say(`Type ${ERASE_WORD} to confirm.`);
      input.focus();
      return;
    }
    input.value = "";
    try {
      const receipt = await api("POST", "/api/me/erase", { confirm: ERASE_WORD });
      history.replaceState(null, "", "#conversations");
      await showConversations({ keepReceipt: true });
      say("Everything is erased.");
      showReceipt(receipt, "Everything is erased: your conversations are gone from your memory and from your assistant's search.");
    } catch (failure) {
      failed(failure);
    }
  });

  $("audit-more").addEventListener("click", () => {
    if (auditNext !== null) loadAudit(auditNext).catch(failed);
  });

  window.addEventListener("hashchange", route);

  (async () => {
    if (sessionStorage.getItem(TOKEN_KEY)) {
      try {
        await signIn(sessionStorage.getItem(TOKEN_KEY));
      } catch (failure) {
        failed(failure);
        return;
      }
    }
    await route();
  })();
})();
