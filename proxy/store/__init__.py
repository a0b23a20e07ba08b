"""Persistence: the conversation database (SQLite via aiosqlite) and content-addressed payload files."""
