"""Who owns a file, in words: the controller and an attached worker both refuse a connection
directory of someone else's and name its owner the same way."""

from __future__ import annotations


def user_name(uid: int) -> str:
    """``alice (uid 1000)``, or ``uid 1000`` for a uid with no account here."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
