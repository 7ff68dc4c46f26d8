"""The chat: a model writes the code, the session runs it (docs/chat.md)."""
