"""What recall is about, wherever it is stored: a conversation (conversation.py), the forgetting
rules as values (forgetting.py), the errors (errors.py) and the answers (answers.py). No files,
no SQL: both stores and the server import it; it imports neither store (tests/test_architecture.py).
"""
