"""What looks like a secret, and hiding it: the one detector for everything tfdist_nb writes that
a user may share (``%tfdist_report``) or keep (``%tfdist_export``'s warning). A secret is
recognised by its name, its shape or its value (docs/reference.md, Secrets). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"
#: shorter values are not hunted for elsewhere in the text (they would match everywhere)
MIN_SECRET_LEN = 4

#: a secret word anywhere in a name; not ``max_tokens``, ``tokenizer``, ``author``, ``keyboard``
_WORD = (r"api[_-]?key|apikey|access[_-]?key|secret|token(?!s|iz)|passw(?:or)?d|passphrase|pwd"
         r"|credential|private[_-]?key|auth(?!or(?!iz))|dsn|connection[_-]?string|cookie"
         r"|signature|(?<![a-z])(?:pat|key|keys|sig)(?![a-z])")
SECRET_NAME = re.compile(rf"(?i)(?:{_WORD})")
#: a name carrying a secret word, possibly quoted or subscripted (``os.environ["API_KEY"]``)
_NAME = rf"[\w.\-'\"\[]*?(?:{_WORD})[\w\-]*['\"\]]*"
_QUOTED = re.compile(rf"(?i)\b(?P<name>{_NAME})(?P<op>\s*[=:]\s*f?)(?P<q>['\"])(?P<v>.*?)(?P=q)")
#: a bare value (``GITHUB_PAT=ghp_...``); a number is not taken for one (``token_count = 5``)
_BARE = re.compile(rf"(?i)\b(?P<name>{_NAME})(?P<op>\s*[=:]\s*)(?!f?['\"])"
                   r"(?![\d.]+(?:$|[\s,;)}\]]))(?P<v>[^\s'\"`,;)}\]]+)")
#: (what it is, pattern); group "v" is the part hidden, else the whole match
SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("URL credentials", re.compile(r"\b[a-z][a-z0-9+.\-]*://[^\s:/@'\"]+:(?P<v>[^\s/@'\"]+)@",
                                   re.I)),
    ("Authorization value", re.compile(r"(?i)\bauthorization['\"]?\s*[:=]\s*['\"]?"
                                       r"(?:(?:bearer|basic|token|digest)\s+)?"
                                       r"(?P<v>[^\s'\",;}]+)")),
    ("Bearer token", re.compile(r"(?i)\bbearer\s+(?P<v>[A-Za-z0-9._~+/=\-]{8,})")),
    ("AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{20,})")),
    ("GitLab token", re.compile(r"\bglpat-[\w\-]{20,}")),
    ("Slack token", re.compile(r"\bxox[abprs]-[\w\-]{10,}")),
    ("Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("Google API key", re.compile(r"\bAIza[\w\-]{35}")),
    ("npm token", re.compile(r"\bnpm_[A-Za-z0-9]{36}")),
    ("API key", re.compile(r"\bsk-[\w\-]{20,}")),
    ("JWT", re.compile(r"\beyJ[\w\-]{8,}\.[\w\-]{8,}\.[\w\-]{8,}")),
    ("private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE "
                               r"KEY-----", re.S)),
    ("Azure key", re.compile(r"(?i)\b(?:AccountKey|SharedAccessKey|SharedAccessSignature)="
                             r"(?P<v>[^;\s'\"]+)")),
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def secret_name(name: str) -> bool:
    """Whether ``name`` (a variable, an environment variable, a header) carries a secret word."""
    return SECRET_NAME.search(name) is not None


def secret_setting(name: str, value: str) -> bool:
    """Whether an environment variable (``--env NAME=VALUE``) holds a secret: by its name or
    its value's shape."""
    return secret_name(name) or bool(shapes_in(value))


def shapes_in(text: str) -> list[str]:
    """What kinds of well-known secret shapes ``text`` holds (``["URL credentials"]``)."""
    return [what for what, pattern in SHAPES if pattern.search(text)]


def redact(text: str, values: Iterable[str] = ()) -> str:
    """``text`` with every secret hidden: ``values`` wherever they turn up, secret shapes, and
    values assigned to secret names (``api_key = '...'``, ``GITHUB_PAT=...``). Terminal colours
    are dropped."""
    text = _ANSI.sub("", text)
    for value in sorted(set(values), key=len, reverse=True):
        if len(value) >= MIN_SECRET_LEN:
            text = text.replace(value, REDACTED)
    for _, pattern in SHAPES:  # before the names: "Authorization: Bearer x" is a name too
        text = pattern.sub(_hide_match, text)
    text = _QUOTED.sub(lambda m: f"{m['name']}{m['op']}{m['q']}{REDACTED}{m['q']}", text)
    return _BARE.sub(lambda m: f"{m['name']}{m['op']}{REDACTED}", text)


def _hide_match(m: re.Match[str]) -> str:
    if "v" not in m.re.groupindex or m.group("v") is None:
        return REDACTED
    start, end = m.span("v")
    whole = m.group(0)
    return whole[:start - m.start()] + REDACTED + whole[end - m.start():]


def secret_values(codes: Iterable[str], env: Mapping[str, str]) -> set[str]:
    """The values a secret name is given in the cells and the environment, and every value
    there with a secret's shape: hidden wherever else they appear."""
    found = {v for k, v in env.items() if v and secret_setting(k, v)}
    for code in codes:
        found.update(m["v"] for pattern in (_QUOTED, _BARE) for m in pattern.finditer(code)
                     if m["v"])
    return found


def assignments(code: str) -> list[str]:
    """The secret names a literal is assigned to in ``code`` (``api_key`` of ``api_key = 'x'``)
    and the kinds of secret shapes it holds; values never."""
    names = [m["name"] for pattern in (_QUOTED, _BARE) for m in pattern.finditer(code)]
    return list(dict.fromkeys([*names, *shapes_in(code)]))
