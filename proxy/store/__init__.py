"""Persistence: SQLite (``sqlite/``) or PostgreSQL (``postgres/``), the payload files, and the protocols the
engine sees (``base.py``); ``location.py`` says which store a config names."""
