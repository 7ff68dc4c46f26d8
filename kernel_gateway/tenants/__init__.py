"""Who is asking: API keys, the principal each request acts as, what each key may hold.

`principal.py` is pure (a request's principal and its quotas); `keys.py` keeps the keys
(hashed, in SQLite in the runtime folder). Everything above asks a `Principal` whether it
may see a resource by the owner written on it; nothing here knows sessions.
"""
