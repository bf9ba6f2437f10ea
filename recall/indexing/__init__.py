"""What both stores' indexes share: the pieces a conversation is indexed as and the rows a run
changes (pieces.py), the index worker processes that embed them (workers.py), and the model and
workers as the settings configure them (configured.py)."""
