"""The errors every layer shares: raised by either store or engine, answered by the server.
Each message names a field or a cause, never user text."""


class InvalidConversation(ValueError):
    """A refused body; the message starts with the offending field, e.g. ``turns[2].ts: ...``."""


class StoreUnavailable(Exception):
    """The store cannot be reached now (the database is down); a retry later may succeed.
    The message names the cause, never user data."""


class EngineError(Exception):
    """An index run or a recall failed; the message names the cause, never user text."""


class Forgotten(Exception):
    """A post whose every turn is forgotten (its conversation's tombstone, or the erasure)."""


class NotFound(Exception):
    """No such conversation was ever stored (or it was never forgotten)."""


class NotDue(Exception):
    """A conditional forget's condition no longer held under the conversation's lock (it was
    resumed after the retention sweep listed it): nothing was removed, no receipt written."""
