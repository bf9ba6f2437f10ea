// The memory page: plain JavaScript, no build step, nothing fetched from elsewhere.
//
// Rules this file keeps (the page's Content-Security-Policy enforces the first two):
// - no markup is ever built from a string: every element is made with createElement, and every
//   piece of data (conversation text, queries, ids, dates) goes in as text (append of a string
//   makes a Text node; textContent); no innerHTML, insertAdjacentHTML or document.write;
// - no inline code: this file is the page's only script;
// - the token lives in sessionStorage only (gone when the tab closes) and travels only in the
//   Authorization header of requests to this server; no token, user id or query in any URL
//   (the #fragment holds at most a conversation's reference and a turn number, and never leaves
//   the browser).
// Turns show a small subset of Markdown (paragraphs, lists, pipe tables, fenced code, **bold** and
// `code`), parsed here into elements whose text goes in as Text nodes: a tag in a turn stays text.
"use strict";

(() => {
  const TOKEN_KEY = "recall.token";
  const VIEWS = ["signin", "conversations", "conversation", "search", "audit", "import", "erase"];
  const IMPORT_POLL_MS = 1000;
  const ERASE_WORD = "erase";
  const SPEAKERS = { user: "You", assistant: "Assistant", system: "System", tool: "Tool" };
  const OUTCOMES = {
    nothing_found: "Nothing relevant was found.",
    no_memory: "No conversations were stored yet.",
    unavailable: "Your memory was unavailable at that moment; nothing was given.",
    not_found: "No conversation of yours had that reference (or it was forgotten).",
    not_yet: "Your conversations were still being indexed; nothing was given.",
  };

  // What a title or a first line shows: under the server's cut (FIRST_LINE_CHARS, 160), so every
  // line the server cut ends in an ellipsis here.
  const SHORT_LINE = 120;
  const SHORT_NAME = 64; // a conversation's name where it names a passage's conversation

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

  // At most `limit` characters, cut after a whole word and marked with an ellipsis (a word longer
  // than half the room is cut where it must be).
  function shorten(text, limit = SHORT_LINE) {
    const chars = Array.from(text); // code points: a cut never splits a character
    if (chars.length <= limit) return text;
    const head = chars.slice(0, limit - 1).join("");
    const lastSpace = head.search(/\s\S*$/u);
    const wholeWord = /\s/u.test(chars[limit - 1]) || lastSpace < head.length / 2;
    return `${(wholeWord ? head : head.slice(0, lastSpace)).replace(/[\s,;:.]+$/u, "")}…`;
  }

  // A conversation by its reference and a turn by its number (as the agent's read tool names
  // them), never by the gateway's conversation id.
  function conversationLink(ref, turn) {
    const target = turn === undefined ? "" : `/${encodeURIComponent(turn)}`;
    return `#conversation/${encodeURIComponent(ref)}${target}`;
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
    if (body instanceof Blob) {
      init.headers["Content-Type"] = "application/octet-stream"; // the export, as it is
      init.body = body;
    } else if (body !== undefined) {
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
        { href: conversationLink(item.ref) },
        el("span", { class: "date" }, when(item.date)),
        el("span", { class: "first-line" }, shorten(item.first_line || item.conversation_id)),
      );
      list.append(el("li", { class: "card" }, link, el("span", { class: "count" }, plural(item.turns, "turn"))));
    }
    if (!conversations.length) {
      list.append(el("li", { class: "empty" }, "No conversations are stored for you."));
    }
    show("conversations", options);
  }

  async function openConversation(ref, number) {
    let data;
    try {
      data = await api("POST", "/api/me/conversation", { ref });
    } catch (failure) {
      if (failure.status !== 404) throw failure;
      await showConversations();
      say("That conversation is not stored (it may have been forgotten).");
      return;
    }
    const conversationId = data.conversation_id;
    const turns = data.turns;
    const first = turns.find((turn) => turn.text.trim());
    const title = first ? first.text.trim().split("\n")[0] : conversationId;
    current = { id: conversationId, title };
    $("conversation-title").textContent = shorten(title);
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
          { class: `turn role-${turn.role in SPEAKERS ? turn.role : "other"}`, id: `turn-${turn.seq + 1}`, tabindex: "-1" },
          el("p", { class: "speaker" }, el("strong", {}, label), " · ", el("time", { datetime: turn.ts }, when(turn.ts)), ` · turn ${turn.seq + 1}`),
          rendered(turn.text, plain),
        ),
      );
    }
    show("conversation");
    const target = number === undefined ? null : $(`turn-${number}`);
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

  // Text as it is: one Text node.
  const plain = (text) => [text];

  // Text with the terms marked: Text nodes and <mark> elements, never markup.
  function marker(terms) {
    if (!terms.length) return plain;
    const escaped = terms.map((term) => term.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    const pattern = new RegExp(`(${escaped.join("|")})`, "giu");
    return (text) => text.split(pattern).flatMap((part, index) => (part ? [index % 2 ? el("mark", {}, part) : part] : []));
  }

  // **bold** and `code` inside a line; the text of each goes through `mark`.
  function inline(text, mark) {
    return text.split(/(\*\*[^*\n]+\*\*|`[^`\n]+`)/).flatMap((part, index) => {
      if (!(index % 2)) return part ? mark(part) : [];
      return part.startsWith("`") ? [el("code", {}, ...mark(part.slice(1, -1)))] : [el("strong", {}, ...mark(part.slice(2, -2)))];
    });
  }

  const FENCE = /^\s*```/;
  const ITEM = /^(\s*)([-*+]|(\d{1,9})[.)])\s+(.*)$/;
  const TABLE_RULE = /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/;

  // A line of a plain-text table aligned with spaces, as programs print them: a gap of three or
  // more spaces (or a tab) between words, or two gaps of two; or a line of box-drawing or rule
  // characters.
  const ALIGNED_ROW = /\S(?: {3,}|\t)\S|\S {2}\S.*\S {2}\S|[│┃┼╋─━]|^\s*[-=+|:]{3,}[-=+|: ]*$/;

  function alignedStart(lines, i) {
    return ALIGNED_ROW.test(lines[i]) && i + 1 < lines.length && ALIGNED_ROW.test(lines[i + 1]);
  }

  function tableStart(lines, i) {
    return lines[i].includes("|") && i + 1 < lines.length && lines[i + 1].includes("|") && TABLE_RULE.test(lines[i + 1]);
  }

  function cells(line) {
    const row = line.trim().replace(/^\|/, "").replace(/\|$/, "");
    return row.split("|").map((cell) => cell.trim());
  }

  // A passage's text, its Markdown rendered and the query's words marked.
  function highlighted(text, terms) {
    return rendered(text, marker(terms));
  }

  // A turn's text as elements: fenced code, pipe tables, plain-text tables aligned with spaces
  // (monospace, as written), bulleted and numbered lists, and paragraphs (line breaks kept).
  // Anything else is a paragraph, shown as written.
  function rendered(text, mark) {
    const box = el("div", { class: "text" });
    const lines = text.split("\n");
    let i = 0;
    while (i < lines.length) {
      if (!lines[i].trim()) {
        i += 1;
      } else if (FENCE.test(lines[i])) {
        const code = [];
        for (i += 1; i < lines.length && !FENCE.test(lines[i]); i += 1) code.push(lines[i]);
        i += 1; // the closing fence (or the end)
        box.append(el("pre", {}, el("code", {}, ...mark(code.join("\n")))));
      } else if (tableStart(lines, i)) {
        const piped = lines[i].trim().startsWith("|"); // then every row starts with one
        const head = cells(lines[i]);
        const rows = [];
        for (i += 2; i < lines.length && lines[i].includes("|") && (!piped || lines[i].trim().startsWith("|")); i += 1) {
          rows.push(cells(lines[i]));
        }
        const row = (tag, values) => el("tr", {}, ...values.map((value) => el(tag, tag === "th" ? { scope: "col" } : {}, ...inline(value, mark))));
        const table = el("table", {}, el("thead", {}, row("th", head)), el("tbody", {}, ...rows.map((values) => row("td", values))));
        box.append(el("div", { class: "table" }, table)); // scrolls sideways, not the page
      } else if (alignedStart(lines, i)) {
        const rows = [];
        for (; i < lines.length && lines[i].trim() && ALIGNED_ROW.test(lines[i]); i += 1) rows.push(lines[i]);
        box.append(el("pre", { class: "aligned" }, ...mark(rows.join("\n")))); // columns kept; scrolls sideways
      } else if (ITEM.test(lines[i])) {
        const ordered = ITEM.exec(lines[i])[3] !== undefined;
        const list = el(ordered ? "ol" : "ul", {});
        for (let item; i < lines.length && (item = ITEM.exec(lines[i])) && (item[3] !== undefined) === ordered; i += 1) {
          const attributes = ordered ? { value: item[3] } : {}; // the numbers as written
          if (item[1]) attributes.class = "nested";
          list.append(el("li", attributes, ...inline(item[4], mark)));
        }
        box.append(list);
      } else {
        const paragraph = [];
        for (; i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) && !ITEM.test(lines[i]) && !tableStart(lines, i) && !alignedStart(lines, i); i += 1) {
          paragraph.push(lines[i]);
        }
        box.append(el("p", {}, ...inline(paragraph.join("\n"), mark)));
      }
    }
    return box;
  }

  // "You · 2026-10-08 09:20 UTC · turn 5": who said a turn, when, and which turn it is.
  function saidBy(turn) {
    const label = turn.recalled ? `${turn.speaker} (answered from recall)` : turn.speaker;
    return [el("strong", {}, label), " · ", el("time", { datetime: turn.ts }, when(turn.ts)), ` · turn ${turn.number}`];
  }

  // A conversation named by its first line, linked at one of its turns.
  function conversationName(link) {
    return el("a", { href: conversationLink(link.ref, link.turn), class: "conversation-name" }, shorten(link.title || "(a conversation with no text)", SHORT_NAME));
  }

  // A turn beside a hit, folded: who and when, and its first line; open, the turn whole.
  function neighbour(turn, where, terms) {
    const firstLine = turn.text.trim().split("\n")[0] || "";
    return el(
      "details",
      { class: "neighbour" },
      el("summary", {}, `${where}: `, ...saidBy(turn), el("span", { class: "first-line" }, shorten(firstLine, 80))),
      highlighted(turn.text, terms),
    );
  }

  // The search's own status, just above its results: "Searching…", how many passages, and what
  // the answer says beside them (all it says when there are none): each said once.
  function searchSays(message) {
    $("search-status").textContent = message;
  }

  async function search(query) {
    searchSays("Searching…");
    const data = await api("POST", "/api/me/search", { query });
    const list = $("search-results");
    clear(list);
    const terms = queryTerms(data.query);
    for (const hit of data.passages) {
      list.append(
        el(
          "li",
          { class: "card passage" },
          el("p", { class: "passage-where" }, "In ", conversationName(hit.turns[0])),
          el("p", { class: "passage-head" }, ...saidBy(hit)),
          highlighted(hit.text, terms),
          ...hit.before.map((turn) => neighbour(turn, "Before", terms)),
          ...hit.after.map((turn) => neighbour(turn, "After", terms)),
        ),
      );
    }
    const count = data.passages.length ? `${plural(data.passages.length, "passage")} found.` : "";
    searchSays([count, ...data.notes].filter(Boolean).join("\n"));
  }

  let auditNext = null; // where the next page of the audit starts (null: none)

  // What a read of a conversation asked for: its turns, in the conversation its turns came from
  // (a read that was given none names no conversation).
  function readRange(read, served) {
    const from = read.from_turn || 1;
    const range = read.to_turn ? `turns ${from} to ${read.to_turn}` : `from turn ${from}`;
    const link = served.flatMap((hit) => hit.turns)[0];
    return el("p", {}, `Read ${range} of `, link ? conversationName(link) : "a conversation");
  }

  // A passage the assistant was given: who said it and when, in which conversation (linked at
  // its turn), or that it is no longer stored.
  function servedItem(hit) {
    const who = hit.speaker || SPEAKERS[hit.role] || "";
    const said = [who, when(hit.ts)].filter(Boolean).join(", ");
    if (!hit.turns.length) return el("li", { class: "gone" }, `${said} (no longer stored)`);
    return el("li", {}, el("span", { class: "said" }, said), " in ", conversationName(hit.turns[0]));
  }

  function auditEntry(entry) {
    const reading = entry.tool === "read_my_conversation";
    const given = reading ? plural(entry.served.length, "turn") : plural(entry.served.length, "passage");
    const outcome = entry.outcome === "passages" ? `Given ${given}:` : OUTCOMES[entry.outcome] || entry.outcome;
    const asked = reading ? readRange(entry.read || {}, entry.served) : el("p", {}, "Searched for ", el("q", {}, entry.query));
    return el(
      "li",
      { class: "card" },
      el("p", { class: "passage-head" }, el("time", { datetime: entry.at }, when(entry.at)), " · ", "client ", el("code", {}, entry.client || "unknown")),
      asked,
      el("p", {}, outcome),
      entry.served.length ? el("ul", { class: "served" }, ...entry.served.map(servedItem)) : null,
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

  // --- bring your history: an export's upload, its progress and summary ---------------------

  function importSays(text) {
    $("import-status").textContent = text;
  }

  // The summary as the server counts it: numbers and reasons only.
  function showImport(job) {
    const list = $("import-summary");
    clear(list);
    const bar = $("import-progress");
    bar.hidden = job.state !== "importing";
    bar.max = Math.max(job.total, 1);
    bar.value = job.done;
    const s = job.summary;
    if (job.state === "importing") {
      importSays(`Importing: ${job.done} of ${plural(job.total, "conversation")}…`);
    } else if (job.state === "done") {
      importSays(`Done: ${plural(s.imported, "conversation")} imported.`);
    } else {
      importSays(job.error || "The import failed.");
    }
    list.append(
      el("li", {}, `${plural(s.conversations, "conversation")} in the export, ${plural(s.turns, "message")} to import`),
      el("li", {}, `Imported: ${s.imported}; already in your memory: ${s.unchanged}; forgotten before, left out: ${s.forgotten}`),
    );
    for (const [why, count] of Object.entries(s.skipped)) {
      list.append(el("li", {}, `Conversations skipped (${why}): ${count}`));
    }
    for (const [why, count] of Object.entries(s.skipped_turns)) {
      list.append(el("li", {}, `Messages skipped (${why}): ${count}`));
    }
    for (const [kind, count] of Object.entries(s.redacted)) {
      list.append(el("li", {}, `Credentials hidden (${kind}): ${count}`));
    }
  }

  async function followImport() {
    const { import: job } = await api("GET", "/api/me/import");
    if (!job) return;
    showImport(job);
    if (job.state === "importing") setTimeout(() => followImport().catch(failed), IMPORT_POLL_MS);
  }

  async function startImport() {
    const file = $("import-file").files[0];
    if (!file) return;
    clear($("import-summary"));
    importSays("Uploading and checking the export…");
    const format = encodeURIComponent($("import-format").value);
    const { import: job } = await api("POST", `/api/me/import?format=${format}`, file);
    showImport(job);
    await followImport();
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
      } else if (name === "import") {
        show("import");
        await followImport();
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
    search($("query").value).catch((failure) => {
      if (failure instanceof SignedOut) failed(failure);
      else searchSays(failure.message || "Something went wrong.");
    });
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

  $("import-form").addEventListener("submit", (event) => {
    event.preventDefault();
    startImport().catch((failure) => {
      if (failure instanceof SignedOut) failed(failure);
      else importSays(failure.message || "Something went wrong.");
    });
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
