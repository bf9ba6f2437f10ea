"""`recall-server import DATA_DIR` and `recall-server export --user USER --out DIR`: the bridge
between the two stores, and the one module that reads both (the files store's layout and
PostgreSQL's tables); neither store imports it.

Import loads a files store into PostgreSQL (DATABASE_URL, the owner's or the app role's), one
transaction per user, so an interrupted import resumes where it stopped and a second run changes
nothing. Per user: the conversations as stored (bodies already validated and redacted: byte for
byte), the tombstones (digests under the files store's key, which joins server_keys under its
key_id; the time rules from before digests into tombstone_times, the erasure's as '*'), the
receipts and the audit; then the user is due for indexing. What is already in PostgreSQL wins
where it is newer: a conversation there with a later last turn (or as late, and as long) is
kept, and one forgotten there since (tombstones the files store does not have) is left out.

A run after an earlier one also applies to PostgreSQL what the files store forgot or erased
since (docs/replicas.md says to run it again after the gateway switched over):

- an erase receipt PostgreSQL does not hold yet: the user is erased there as an erase there
  does it (recall.pg.store.remove_user: conversations, index, audit; tombstones and receipts
  stay), then what the files store holds now (posted after the erase) comes in;
- a conversation whose stored turns the files store's tombstones forget: removed as a forget
  there removes it (recall.pg.store.remove_conversation: its row and index pieces); the turns
  they do not forget (posted to PostgreSQL after the switch) are kept, as a post would store them;
- an audit line stamped at or before an erase, on either side, never comes (back) in.

The user's index lock and row (FOR UPDATE) are held meanwhile, as an erase holds them, so posts,
forgets and index runs of that user on a live replica wait for it and then see it.

Export writes one user's conversations as `<conversation_id>.funes.jsonl`, the stored bodies
byte for byte, into a directory funes can be pointed at: made 0700 (an existing one of the
caller's is tightened to 0700, another's refused), each file written under a fresh temporary
name (O_EXCL|O_NOFOLLOW: never through a link planted there) and renamed into place.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import stat
import sys
import uuid
from collections import Counter
from contextlib import suppress
from dataclasses import astuple, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recall.domain.conversation import SOURCE_SUFFIX, Conversation, readable_lines, user_dir_name
from recall.domain.errors import Forgotten, StoreUnavailable
from recall.domain.forgetting import EVERYTHING, Forgetting, admitted
from recall.files import audit_file
from recall.files.layout import PRIVATE_DIR, PRIVATE_FILE
from recall.files.lifecycle import (
    KEYS_DIR,
    RECEIPTS_DIR,
    TOMBSTONE_KEY,
    list_receipts,
    read_tombstones,
    time_rule,
    tombstone_key,
    user_homes,
)
from recall.pg.database import Connection, Database
from recall.pg.index import index_lock
from recall.pg.schema import MigrationError, check_version, connect, key_id
from recall.pg.store import add_tombstones, remove_conversation, remove_user
from recall.settings import ConfigError

Turn = dict[str, Any]


@dataclass(frozen=True)
class Stored:
    """One conversation file of the files store."""

    conversation_id: str
    body: str  # the file, as stored
    first_ts: datetime
    last_ts: datetime
    turns: int


@dataclass(frozen=True)
class FilesUser:
    """Everything the files store holds for one user."""

    user_hash: str
    conversations: list[Stored]
    unreadable: int  # conversation files that are not readable turns: left out, counted
    tombstones: dict[str, Any]  # recall.files.lifecycle.read_tombstones
    receipts: list[dict[str, Any]]
    audit: list[dict[str, Any]]


@dataclass
class Imported:
    written: int = 0
    kept: int = 0  # already in PostgreSQL, as new or newer
    forgotten: int = 0  # forgotten in PostgreSQL since
    erased: int = 0  # erased on the files store since: erased in PostgreSQL too
    removed: int = 0  # conversations in PostgreSQL the files store forgot since: removed there
    unreadable: int = 0
    receipts: int = 0
    audit: int = 0
    audit_erased: int = 0  # audit lines from before an erase: left out

    def add(self, other: Imported) -> None:
        for name in (f.name for f in fields(self)):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def line(self) -> str:
        extra = [
            *([f"{self.kept} already there"] if self.kept else []),
            *([f"{self.forgotten} forgotten there since, left out"] if self.forgotten else []),
            *([f"{self.erased} erased on the files store since"] if self.erased else []),
            *(
                [f"{self.removed} forgotten on the files store since, removed"]
                if self.removed
                else []
            ),
            *([f"{self.unreadable} unreadable, left out"] if self.unreadable else []),
            *([f"{self.receipts} receipts"] if self.receipts else []),
            *([f"{self.audit} audit lines"] if self.audit else []),
            *(
                [f"{self.audit_erased} audit lines from before an erase, left out"]
                if self.audit_erased
                else []
            ),
        ]
        return f"{self.written} conversations" + (f" ({', '.join(extra)})" if extra else "")


class ImportRefused(Exception):
    """The files store cannot be imported as it is; the message says why (no user data)."""


class ExportRefused(Exception):
    """The export's directory cannot be used; the message says why."""


def _moment(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def read_conversation(path: Path) -> Stored | None:
    """A source file as stored; None when it holds no readable turns (a damaged file)."""
    try:
        body = path.read_bytes().decode("utf-8")
        moments = [_moment(json.loads(line)["ts"]) for line in body.splitlines()]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not moments:
        return None
    cid = path.name[: -len(SOURCE_SUFFIX)]
    return Stored(cid, body, min(moments), max(moments), len(moments))


def read_user(data_dir: Path, user_hash: str) -> FilesUser:
    home = data_dir / user_hash
    try:
        tombstones = read_tombstones(home)
    except (OSError, ValueError) as exc:  # never import a user without what they forgot
        raise ImportRefused(
            f"user {user_hash}: tombstones.json unreadable ({type(exc).__name__}): restore it "
            "from the backup of DATA_DIR first"
        ) from exc
    stored = [read_conversation(path) for path in sorted((home / "src").glob(f"*{SOURCE_SUFFIX}"))]
    return FilesUser(
        user_hash=user_hash,
        conversations=[c for c in stored if c is not None],
        unreadable=sum(c is None for c in stored),
        tombstones=tombstones,
        receipts=list_receipts(data_dir, user_hash),
        audit=audit_file.read(home),
    )


def files_users(data_dir: Path) -> list[str]:
    """Every user hash with a directory, or receipts only (an erasure's outlive it)."""
    receipts = data_dir / RECEIPTS_DIR
    stems = (
        {p.name[: -len(".jsonl")] for p in receipts.glob("*.jsonl")} if receipts.is_dir() else set()
    )
    return sorted({home.name for home in user_homes(data_dir)} | stems)


def _canonical(line: Any) -> str:
    return json.dumps(line, sort_keys=True, ensure_ascii=False)


async def import_user(
    conn: Connection, user: FilesUser, files_key: tuple[str, bytes] | None
) -> Imported:
    """One user's data into PostgreSQL, in the caller's transaction (`Database.user`)."""
    h, done = user.user_hash, Imported(unreadable=user.unreadable)
    # As an erase: the index lock (index runs wait), then the row FOR UPDATE (posts and forgets
    # of this user wait), then they see what was imported and removed.
    await conn.execute(index_lock(h))
    await conn.execute("INSERT INTO users (user_hash) VALUES (%s) ON CONFLICT DO NOTHING", (h,))
    await conn.execute("SELECT 1 FROM users WHERE user_hash = %s FOR UPDATE", (h,))
    forgotten_there = await _import_tombstones(conn, user, files_key[0] if files_key else None)
    cur = await conn.execute("SELECT receipt FROM receipts WHERE user_hash = %s", (h,))
    receipts_there = [row[0] for row in await cur.fetchall()]
    ids_there = {r.get("receipt") for r in receipts_there}
    if any(_is_erase(r) and r.get("receipt") not in ids_there for r in user.receipts):
        await _erase_there(conn, h, files_key)
        done.erased = 1
    else:
        done.removed = await _forget_there(conn, user, files_key)
    cur = await conn.execute(
        "SELECT conversation_id, last_ts, turns FROM conversations WHERE user_hash = %s", (h,)
    )
    there = {cid: (last, turns) for cid, last, turns in await cur.fetchall()}
    for conversation in user.conversations:
        cid = conversation.conversation_id
        if cid in forgotten_there:
            done.forgotten += 1
        elif cid in there and there[cid] >= (conversation.last_ts, conversation.turns):
            done.kept += 1
        else:
            await conn.execute(_UPSERT, (h, *astuple(conversation)))
            done.written += 1
    erased_at = _last_erase([*receipts_there, *user.receipts])
    done.receipts, done.audit, done.audit_erased = await _import_lines(conn, user, erased_at)
    if done.written or done.erased or done.removed:
        # Due for indexing now (no debounce to wait out); a removal counts as a forget, so a
        # recall in flight on a replica reads again and serves nothing removed.
        await conn.execute(
            "UPDATE users SET changes = changes + %s, forgets = forgets + %s, "
            "due_at = coalesce(due_at, now()) WHERE user_hash = %s",
            (done.written + done.erased + done.removed, done.erased + done.removed, h),
        )
    return done


def _is_erase(receipt: dict[str, Any]) -> bool:
    return receipt.get("operation") == "erase"


def _last_erase(receipts: list[dict[str, Any]]) -> datetime | None:
    """When the user was last erased, on either side (None: never). A receipt whose time cannot
    be read counts as now: whatever came before it stays out."""
    moments = []
    for receipt in filter(_is_erase, receipts):
        try:
            moments.append(_moment(str(receipt["at"])))
        except (KeyError, ValueError):
            moments.append(datetime.now(UTC))
    return max(moments, default=None)


async def _erase_there(conn: Connection, h: str, files_key: tuple[str, bytes] | None) -> None:
    """The files store erased the user since the last import: erase them in PostgreSQL as an
    erase there does (their conversations' turns tombstoned, under the files store's key, which
    server_keys holds), keeping the receipts; what the files store holds now comes in after."""
    cur = await conn.execute(
        "SELECT conversation_id, body FROM conversations WHERE user_hash = %s", (h,)
    )
    erased = {cid: readable_lines(body.encode("utf-8")) for cid, body in await cur.fetchall()}
    if files_key is not None:  # the files store made it when it erased (lifecycle.erase_home)
        await add_tombstones(conn, h, erased, files_key)
    await remove_user(conn, h)


async def _forget_there(
    conn: Connection, user: FilesUser, files_key: tuple[str, bytes] | None
) -> int:
    """Apply the files store's tombstones to the conversations PostgreSQL holds: one with turns
    they forget is removed as a forget there removes it; the turns they do not forget (posted to
    PostgreSQL after the gateway switched over) are stored again, as a post would store them.
    How many were removed."""
    h, tombstones = user.user_hash, user.tombstones
    named = sorted({*tombstones["turns"], *tombstones["conversations"]})
    if not named and not tombstones["erased"]:
        return 0
    cur = await conn.execute(
        "SELECT conversation_id, body FROM conversations WHERE user_hash = %s "
        "AND (%s OR conversation_id = ANY(%s))",
        (h, bool(tombstones["erased"]), named),
    )
    removed = 0
    for cid, body in await cur.fetchall():
        digests = frozenset(tombstones["turns"].get(cid, []))
        keyed = {files_key[1]: digests} if files_key is not None and digests else {}
        turns = readable_lines(body.encode("utf-8"))
        try:
            kept = admitted(
                Conversation(h, cid, turns), Forgetting(keyed, time_rule(tombstones, cid))
            )
        except Forgotten:
            kept = None
        except (KeyError, ValueError, TypeError):  # a turn's time unreadable: it all goes
            kept = None
        if kept is not None and len(kept.lines) == len(turns):
            continue  # nothing of it is forgotten
        await remove_conversation(conn, h, cid)
        removed += 1
        if kept is not None:
            moments = [_moment(turn["ts"]) for turn in kept.lines]
            again = Stored(cid, kept.to_jsonl(), min(moments), max(moments), len(moments))
            await conn.execute(_UPSERT, (h, *astuple(again)))
    return removed


_UPSERT = (
    "INSERT INTO conversations (user_hash, conversation_id, body, first_ts, last_ts, turns, "
    "version) VALUES (%s, %s, %s, %s, %s, %s, nextval('conversation_versions')) "
    "ON CONFLICT (user_hash, conversation_id) DO UPDATE SET body = excluded.body, "
    "first_ts = excluded.first_ts, last_ts = excluded.last_ts, turns = excluded.turns, "
    "version = excluded.version"
)


async def _import_tombstones(conn: Connection, user: FilesUser, files_key: str | None) -> set[str]:
    """Add the files store's tombstones; the conversations PostgreSQL has tombstones of that the
    files store does not (forgotten there since an earlier import: never brought back)."""
    h = user.user_hash
    ours = {(cid, files_key, d) for cid, ds in user.tombstones["turns"].items() for d in ds}
    cur = await conn.execute(
        "SELECT conversation_id, key_id, digest FROM tombstones WHERE user_hash = %s", (h,)
    )
    forgotten_there = {row[0] for row in await cur.fetchall() if row not in ours}
    rules = dict(user.tombstones["conversations"])
    if user.tombstones["erased"]:
        rules[EVERYTHING] = user.tombstones["erased"]
    async with conn.cursor() as cursor:
        await cursor.executemany(
            "INSERT INTO tombstones VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
            [(h, *tombstone) for tombstone in sorted(ours, key=str)],
        )
        await cursor.executemany(
            "INSERT INTO tombstone_times VALUES (%s, %s, %s) ON CONFLICT (user_hash, "
            "conversation_id) DO UPDATE SET at = greatest(tombstone_times.at, excluded.at)",
            [(h, cid, _moment(at)) for cid, at in sorted(rules.items())],
        )
    return forgotten_there


async def _import_lines(
    conn: Connection, user: FilesUser, erased_at: datetime | None
) -> tuple[int, int, int]:
    """Add the receipts (by their id) and audit lines (as a multiset: the same line twice is two
    calls) PostgreSQL does not hold yet, but no audit line from before the user's last erase
    (on either side: it removed that line); how many receipts, lines, and lines left out."""
    h = user.user_hash
    cur = await conn.execute("SELECT receipt->>'receipt' FROM receipts WHERE user_hash = %s", (h,))
    receipt_ids = {row[0] for row in await cur.fetchall()}
    receipts = [r for r in user.receipts if r.get("receipt") not in receipt_ids]
    cur = await conn.execute("SELECT line FROM audit WHERE user_hash = %s", (h,))
    lines_there = Counter(_canonical(row[0]) for row in await cur.fetchall())
    lines, erased = [], 0
    for line in user.audit:
        if erased_at is not None and not _after(line, erased_at):
            erased += 1
        elif lines_there[_canonical(line)] > 0:
            lines_there[_canonical(line)] -= 1
        else:
            lines.append(line)
    async with conn.cursor() as cursor:
        await cursor.executemany(
            "INSERT INTO receipts (user_hash, receipt) VALUES (%s, %s)",
            [(h, json.dumps(r)) for r in receipts],
        )
        await cursor.executemany(
            "INSERT INTO audit (user_hash, at, line) VALUES (%s, %s, %s)",
            [(h, str(line.get("at", "")), json.dumps(line)) for line in lines],
        )
    return len(receipts), len(lines), erased


def _after(line: dict[str, Any], moment: datetime) -> bool:
    """Whether an audit line is stamped after ``moment`` (its time is in whole seconds, cut
    down: the second of an erase counts as before it). No, when its time cannot be read."""
    try:
        return _moment(str(line["at"])) > moment
    except (KeyError, ValueError):
        return False


def files_key(data_dir: Path) -> tuple[str, bytes] | None:
    """The files store's tombstone key, named as server_keys names it; None when it never made
    one, and then no tombstone may hold digests (they would match nothing)."""
    if (data_dir / KEYS_DIR / TOMBSTONE_KEY).exists():
        key = tombstone_key(data_dir)
        return key_id(key), key
    for home in user_homes(data_dir):
        if read_tombstones(home)["turns"]:
            raise ImportRefused(
                f"{KEYS_DIR}/{TOMBSTONE_KEY} is missing but tombstones hold digests: restore it "
                "from the backup of DATA_DIR first"
            )
    return None


async def import_store(url: str, data_dir: Path) -> int:
    """Import every user of the files store in DATA_DIR; exit status 0, or 1 when some
    conversation files were unreadable (left out). Progress on stderr, user hashes only."""
    key = files_key(data_dir)
    async with await connect(url) as conn:
        await check_version(conn)
    users = files_users(data_dir)
    database = Database(url, 1, verify=None)  # the owner's: its version checked above
    await database.open()
    totals = Imported()
    try:
        if key is not None:
            async with database.system() as conn:
                await conn.execute(
                    "INSERT INTO server_keys (key_id, value) VALUES (%s, %s) "
                    "ON CONFLICT DO NOTHING",
                    key,
                )
        for number, user_hash in enumerate(users, 1):
            user = read_user(data_dir, user_hash)
            async with database.user(user_hash) as conn:
                done = await import_user(conn, user, key)
            print(f"user {number}/{len(users)} {user_hash}: {done.line()}", file=sys.stderr)
            totals.add(done)
    finally:
        await database.close()
    print(f"imported {len(users)} users: {totals.line()}", file=sys.stderr)
    return 1 if totals.unreadable else 0


async def export_user(url: str, user: str, out: Path) -> int:
    """Write the user's conversations into ``out`` as the files store would hold them; how
    many."""
    user_hash = user_dir_name(user)
    async with await connect(url) as conn:
        await check_version(conn)
    database = Database(url, 1, verify=None)  # the owner's: its version checked above
    await database.open()
    try:
        async with database.user(user_hash, read_only=True) as conn:
            cur = await conn.execute(
                "SELECT conversation_id, body FROM conversations WHERE user_hash = %s "
                "ORDER BY conversation_id",
                (user_hash,),
            )
            rows = await cur.fetchall()
    finally:
        await database.close()
    directory = _private_directory(out)
    try:
        for conversation_id, body in rows:
            _write_new(directory, f"{conversation_id}{SOURCE_SUFFIX}", body.encode("utf-8"))
    finally:
        os.close(directory)
    return len(rows)


def _private_directory(out: Path) -> int:
    """A descriptor of ``out``, the caller's and 0700: made so, or an existing one of the
    caller's tightened; ExportRefused for one of another user (they could read the files, or
    plant links in it). The files are then written relative to it: the checked directory."""
    out.mkdir(PRIVATE_DIR, parents=True, exist_ok=True)
    directory = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        owner = os.fstat(directory)
        if owner.st_uid != os.geteuid():
            raise ExportRefused(
                f"{out}: owned by another user (uid {owner.st_uid}): export into a directory "
                "of your own"
            )
        if stat.S_IMODE(owner.st_mode) != PRIVATE_DIR:
            os.fchmod(directory, PRIVATE_DIR)
    except BaseException:
        os.close(directory)
        raise
    return directory


def _write_new(directory: int, name: str, data: bytes) -> None:
    """Write ``name`` in ``directory`` whole or not at all: into a temporary name of its own
    (never .jsonl: funes reads no half file), created new and never through a link
    (O_EXCL|O_NOFOLLOW), 0600, then renamed over the name (a link there is replaced, not
    followed)."""
    tmp = f".{name}.{uuid.uuid4().hex}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, PRIVATE_FILE, dir_fd=directory)
    try:
        with open(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=directory)
        raise


def main(argv: list[str]) -> int:
    """`import DATA_DIR` or `export --user USER --out DIR` (argv[0] names which)."""
    command, rest = argv[0], argv[1:]
    prog = f"recall-server {command}"
    parser = argparse.ArgumentParser(prog=prog)
    if command == "import":
        parser.description = (
            "Load a files store (DATA_DIR of STORE=files) into PostgreSQL (DATABASE_URL): "
            "conversations, tombstones, receipts, audit; each user then due for indexing. "
            "Safe to re-run: it resumes, changes nothing already there, and removes there what "
            "the files store forgot or erased since."
        )
        parser.epilog = (
            "Exit status: 0 imported; 1 some conversation files unreadable (left out, counted) "
            "or the database went away (re-run to resume); 2 unusable DATA_DIR, DATABASE_URL "
            "or schema."
        )
        parser.add_argument(
            "data_dir", type=Path, metavar="DATA_DIR", help="the files store (its DATA_DIR)"
        )
    else:
        parser.description = (
            "Write one user's conversations from PostgreSQL (DATABASE_URL) as "
            "<conversation_id>.funes.jsonl files, byte for byte as stored, into DIR (made 0700, "
            "or yours tightened to 0700; another user's is refused)."
        )
        parser.epilog = "Exit status: 0 written; 1 the database went away; 2 unusable settings."
        parser.add_argument("--user", required=True, help="the user id (as the gateway sends it)")
        parser.add_argument(
            "--out", required=True, type=Path, metavar="DIR", help="where the files go"
        )
    args = parser.parse_args(rest)
    if not (url := os.environ.get("DATABASE_URL")):
        print(f"{prog}: set DATABASE_URL", file=sys.stderr)
        return 2
    try:
        if command == "import":
            if not args.data_dir.is_dir():
                print(f"{prog}: {args.data_dir}: not a directory", file=sys.stderr)
                return 2
            return asyncio.run(import_store(url, args.data_dir.resolve()))
        count = asyncio.run(export_user(url, args.user, args.out))
    except (MigrationError, ConfigError, ImportRefused, ExportRefused, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:
        print(f"{prog}: {exc}: run it again to resume", file=sys.stderr)
        return 1
    print(
        f"{prog}: {count} conversations of user {user_dir_name(args.user)} in {args.out}",
        file=sys.stderr,
    )
    return 0
