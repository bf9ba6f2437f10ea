"""The funes engine: the funes binary as a subprocess, one process per call (the brief's design).

funes' contract (what it takes and prints) is in docs/CONTRACTS.md; the tests drive this module
through a stand-in executable that honours it, since the binary cannot be had on our machines.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from recall.concurrency import kill_group
from recall.domain.answers import Passage, Recalled
from recall.domain.conversation import CONVERSATION_ID, RECALLED_BLOCK_TYPE, SOURCE_SUFFIX, place
from recall.domain.errors import EngineError
from recall.files.engines.base import ForgetWindows
from recall.files.layout import read_source

log = logging.getLogger("recall.funes")

# funes prints "  → get <session> <turn> --memory <path>" after each hit's header for agents
# that can call `get`. Ours cannot; the lines would only leak server paths and session ids. We
# read them for where each hit comes from, and never pass them on.
HINT = re.compile(r"^[ \t]*→ get (?P<session>\S+) (?P<turn>\S+)(?:[ \t]|$)")
# A hit's header: "[<ts>] <harness> <workdir>/<session8> <block_type>  score=<s>". A hit starts
# where such a line is followed by a hint line: a turn's own text may hold a "---" line or a line
# shaped like a header, but not that pair.
HIT_HEADER = re.compile(r"^\[(?P<ts>[^\]\n]*)\] \S+ \S+ (?P<block_type>\S+)[ \t]+score=\S*[ \t]*$")
HIT_END = "---"  # the line that closes each hit
# A neighbour line "  ~ [<role> <block_type> seq<N>] ..." of a turn answered from recall.
RECALLED_NEIGHBOUR = re.compile(
    rf"^(?P<lead>[ \t]*~ \[\S+ ){re.escape(RECALLED_BLOCK_TYPE)}(?= seq\d+\])"
)
LOCKED = "another funes memory operation is in progress"
REJECTED = "a source file was rejected"
KILL_GRACE = 1.0
READ_CHUNK = 64 * 1024
MAX_OUTPUT_BYTES = 64 * 1024  # stdout kept per call; more is read and dropped, never stored
STDERR_TAIL_BYTES = 8 * 1024  # enough for the last message, which is all we look at
# What a failure is, told from funes' stderr. Only these fixed words reach the log: stderr may
# echo the query or name paths, so its text never does.
FAILURE_KINDS = (
    (re.compile(re.escape(LOCKED)), "memory locked by another run"),
    (re.compile(r"model.*(not found|missing)|(not found|missing).*model", re.I), "model missing"),
    (re.compile(r"no memory", re.I), "no memory"),
    (re.compile(r"rejected", re.I), REJECTED),
    (re.compile(r"unexpected argument|usage:", re.I), "bad arguments"),
)


def find_funes(configured: str | None) -> str | None:
    """An executable funes: FUNES_BIN when set, else `funes` on PATH."""
    candidate = configured or "funes"
    found = shutil.which(candidate)
    return found if found and os.access(found, os.X_OK) else None


@dataclass(frozen=True)
class ProcessResult:
    code: int
    stdout: str
    stderr: str


async def run_process(
    argv: list[str],
    env: dict[str, str],
    timeout: float | None = None,
    max_output_bytes: int = MAX_OUTPUT_BYTES,
) -> ProcessResult:
    """Run a child in its own process group; on timeout or cancellation, kill the whole group.

    funes can start children of its own (git, a secret scanner); killing only the direct child
    would leave them holding the pipes, and `wait()` would hang. Its stdout is kept up to
    ``max_output_bytes`` and its stderr's last few KiB: the rest is read and dropped, so a
    runaway output costs neither memory nor a blocked child.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,  # a first long index prompts when stdin is a terminal
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        out, err, _ = await asyncio.wait_for(
            asyncio.gather(
                _read_head(proc.stdout, max_output_bytes),
                _read_tail(proc.stderr, STDERR_TAIL_BYTES),
                proc.wait(),
            ),
            timeout,
        )
    except BaseException:  # timeout, or the caller was cancelled (client went away)
        await kill_group(proc, KILL_GRACE)
        raise
    assert proc.returncode is not None
    return ProcessResult(
        proc.returncode, out.decode(errors="replace"), err.decode("utf-8", "replace")
    )


async def _read_head(stream: asyncio.StreamReader, limit: int) -> bytes:
    kept = bytearray()
    while chunk := await stream.read(READ_CHUNK):
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    return bytes(kept)


async def _read_tail(stream: asyncio.StreamReader, limit: int) -> bytes:
    kept = bytearray()
    while chunk := await stream.read(READ_CHUNK):
        kept += chunk
        del kept[:-limit]
    return bytes(kept)


class FunesEngine:
    name = "funes"

    def __init__(
        self,
        binary: str,
        *,
        k: int = 3,
        candidates: int = 8,
        hf_home: Path | None = None,
        index_timeout: float = 300.0,
        lock_retries: int = 5,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
    ) -> None:
        self.binary = binary
        self.k = k
        self.candidates = candidates
        self.hf_home = hf_home
        self.index_timeout = index_timeout
        self.lock_retries = lock_retries
        self.max_output_bytes = max_output_bytes
        self._forgetting = ForgetWindows()

    def _env(self, home: Path) -> dict[str, str]:
        # A cleared environment: funes sees its memory, its models, offline mode and PATH only.
        env = {
            "FUNES_HOME": str(home),
            "HF_HUB_OFFLINE": "1",
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        }
        if self.hf_home:
            env["HF_HOME"] = str(self.hf_home)
        return env

    def has_memory(self, home: Path) -> bool:
        return (home / "memory").exists()

    def index_outdated(self, home: Path) -> bool:
        return False  # funes keeps its own index format and rebuilds it itself

    def ready(self) -> str | None:
        # Each call starts the binary afresh: it must still be there and executable.
        binary = Path(self.binary)
        return None if binary.is_file() and os.access(binary, os.X_OK) else "funes_binary"

    async def index(self, home: Path) -> None:
        await self._index(home, home / "src")

    async def _index(self, funes_home: Path, src: Path, *, rejects_ok: bool = False) -> None:
        """One `funes index`; with ``rejects_ok``, a run that indexed everything but files
        funes rejects counts as done (a forget must not wait on a file nobody can fix)."""
        argv = [self.binary, "index", "--yes", str(src)]
        for attempt in range(self.lock_retries + 1):
            try:
                result = await run_process(
                    argv, self._env(funes_home), self.index_timeout, self.max_output_bytes
                )
            except TimeoutError as exc:
                raise EngineError(f"funes index timed out after {self.index_timeout:g}s") from exc
            except OSError as exc:
                raise EngineError(f"funes could not start: {exc.strerror}") from exc
            if result.code == 0:
                return
            rejected = failure_kind(result.stderr) == REJECTED
            if rejects_ok and rejected and (funes_home / "memory").exists():
                return
            if LOCKED in result.stderr and attempt < self.lock_retries:
                await asyncio.sleep(0.5 * (attempt + 1))  # someone else holds the memory: retry
                continue
            raise EngineError(f"funes index exited {result.code}: {failure_kind(result.stderr)}")

    async def recall(self, home: Path, query: str, *, still_indexing: bool = False) -> Recalled:
        # funes' answer has no line of its own: nothing to word by ``still_indexing``.
        started = time.monotonic()
        # `--` so a user who types "-k 100" is searching for that text, not passing a flag.
        argv = [self.binary, "recall", "-k", str(self.k), "--candidates", str(self.candidates)]
        try:
            result = await run_process(
                [*argv, "--", query], self._env(home), max_output_bytes=self.max_output_bytes
            )
        except OSError as exc:
            raise EngineError(f"funes could not start: {exc.strerror}") from exc
        if result.code != 0:
            raise EngineError(f"funes recall exited {result.code}: {failure_kind(result.stderr)}")
        hidden = self._forgetting.hidden(home, started)
        hits = [
            hit
            for hit in parse_hits(result.stdout)
            # A forget under way (its rows may still be in the memory we read), or a turn
            # answered from recall: funes knows nothing of either and ranks them like any other,
            # so a recall may come back with fewer than k hits, or none.
            if hit.session not in hidden and not hit.block_type.startswith(RECALLED_BLOCK_TYPE)
        ]
        seqs = await asyncio.to_thread(turn_seqs, home, hits)
        # A hit whose turn is no longer in its source was forgotten since funes read it.
        return render_hits(
            (hit for hit in hits if (hit.session, hit.turn) in seqs), home.name, seqs
        )

    async def forget(self, home: Path, conversation_id: str) -> None:
        """funes is append-only: rebuild the memory from the remaining sources in a fresh
        FUNES_HOME, then swap it in with one atomic exchange of the two `memory` directories.
        Until the swap, recalls read the old memory and drop the conversation's hits (the
        `→ get` line names each hit's full session id). funes does not count rows: None."""
        window = self._forgetting.open(home, conversation_id)
        try:
            if not self.has_memory(home):
                return None  # nothing indexed yet: the next index run reads the sources as they are
            fresh = home / f".funes-rebuild-{uuid.uuid4().hex}"
            fresh.mkdir()
            try:
                await self._index(fresh, home / "src", rejects_ok=True)
                exchange(fresh / "memory", home / "memory")
                if (fresh / "state.json").exists():
                    os.replace(fresh / "state.json", home / "state.json")
            finally:
                # the failed build, or after the swap the old memory
                shutil.rmtree(fresh, ignore_errors=True)
            return None
        finally:
            self._forgetting.close(window)

    async def close(self) -> None:
        """Nothing to stop: every funes process lives for one call."""


@dataclass(frozen=True)
class FunesHit:
    """One hit of funes' agent format: where it comes from (its header and hint line), and the
    lines the agent reads (the header, the chunk, the neighbours; no hint, no closing ---)."""

    ts: str
    session: str
    turn: str
    block_type: str
    lines: tuple[str, ...]


def parse_hits(stdout: str) -> list[FunesHit]:
    """funes' output read by its structure: a hit from a header line followed by a hint line up
    to the next such pair, less the ``---`` that closes it. Anything else (``no results``, a
    head with no hit) holds no passage."""
    lines = stdout.splitlines()
    starts = [
        (i, header, hint)
        for i in range(len(lines) - 1)
        if (header := HIT_HEADER.match(lines[i])) and (hint := HINT.match(lines[i + 1]))
    ]
    hits = []
    for n, (start, header, hint) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(lines)
        body = lines[start + 2 : end]
        while body and not body[-1].strip():
            body.pop()
        if body and body[-1].strip() == HIT_END:  # missing on a last hit cut by the output cap
            body.pop()
        lines_shown = (lines[start], *body)
        hits.append(
            FunesHit(header["ts"], hint["session"], hint["turn"], header["block_type"], lines_shown)
        )
    return hits


def turn_seqs(home: Path, hits: Iterable[FunesHit]) -> dict[tuple[str, str], int]:
    """The stored seq of each hit's turn, by (session, turn), read from the user's sources
    (funes prints none for the hit itself); a turn no longer stored has none."""
    seqs: dict[tuple[str, str], int] = {}
    for session in {hit.session for hit in hits}:
        if not CONVERSATION_ID.fullmatch(session):  # it names a file: only a safe id
            continue
        try:
            lines = read_source(home / "src" / f"{session}{SOURCE_SUFFIX}")
        except (OSError, ValueError):  # forgotten since, or unreadable: no place to point at
            continue
        for index, line in enumerate(lines):
            if isinstance(line, dict) and isinstance(line.get("turn_uuid"), str):
                seqs[(session, line["turn_uuid"])] = int(line.get("seq", index))
    return seqs


def render_hits(hits: Iterable[FunesHit], user: str, seqs: dict[tuple[str, str], int]) -> Recalled:
    """The hits as the agent reads them, each closed by ``---``, and where each comes from. A
    turn answered from recall shown as a neighbour is labelled ``recalled``. funes' header is
    passed on as it prints it, with where `read_my_conversation` reads the turn added at its
    end (the reference of ``user``'s conversation, and the turn's number, from ``seqs``)."""
    text = ""
    passages = []
    for hit in hits:
        header, *rest = hit.lines
        where = place(user, hit.session, seqs[(hit.session, hit.turn)])
        block = "".join(
            RECALLED_NEIGHBOUR.sub(r"\g<lead>recalled", line) + "\n"
            for line in (f"{header} · {where}", *rest)
        )
        block += HIT_END + "\n"
        passages.append(
            Passage(hit.session, hit.turn, hit.ts, None, len(text), len(text) + len(block))
        )
        text += block
    return Recalled(text, tuple(passages))


RENAME_EXCHANGE = 2  # linux/fs.h


def exchange(a: Path, b: Path) -> None:
    """Swap two directories in one step (renameat2 RENAME_EXCHANGE): a reader sees the one or
    the other, never neither. Where the call is missing, two renames, with a moment between
    them in which a recall finds no memory and fails soft."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd = -100
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), RENAME_EXCHANGE) == 0:
            return
        errno = ctypes.get_errno()
        if errno not in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not on this filesystem
            raise OSError(errno, os.strerror(errno), str(b))
    aside = b.with_name(f".{b.name}.{uuid.uuid4().hex}")
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def failure_kind(stderr: str) -> str:
    """A fixed description of what went wrong, never the text itself (see FAILURE_KINDS)."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if not lines:
        return "no message"
    for pattern, kind in FAILURE_KINDS:
        if pattern.search(lines[-1]):
            return kind
    return "unrecognised error (stderr not logged: it may hold user text)"
