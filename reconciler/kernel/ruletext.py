"""Rule text: `rule_tokens`, the one tokenizer, and `canonical_rule`, the normal form of a
rule body. nft rewrites rules on read-back (`mark set mark or 0x4000` lists as `meta mark
set meta mark | 0x00004000`, anonymous sets sorted and merged, ...); the normal form of
our text and of nft's listing of it is the same string, and idempotent.
"""

from __future__ import annotations

import ipaddress
import re
from functools import lru_cache

_TOKEN = re.compile(r'"[^"]*"|[{},]|[^\s{},]+')
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_IPISH = re.compile(r"[0-9a-fA-F.:/\-]*[0-9][0-9a-fA-F.:/\-]*")
_OPS = {"or": "|", "and": "&", "xor": "^"}
_L4 = {"tcp", "udp", "sctp", "udplite", "dccp"}
# nft before 1.0 lists a protocol in a rule (`meta l4proto 6`) and in a set element
# (`10.96.0.10 . 6 . 53`) by its number; later ones by its name, as nftrec writes it.
PROTOCOL_NAMES = {"6": "tcp", "17": "udp", "132": "sctp", "136": "udplite", "33": "dccp"}
_COMMENT_TAIL = re.compile(r'\s+comment\s+"([^"]*)"$')


def split_comment(text: str) -> tuple[str, str | None]:
    """`body comment "c"` → (body, c); nft prints a rule's comment last."""
    if '"' not in text:  # most rules: no comment to look for
        return text.strip(), None
    m = _COMMENT_TAIL.search(text)
    if m is None:
        return text.strip(), None
    return text[: m.start()].strip(), m.group(1)


def rule_tokens(text: str) -> list[str]:
    """A rule body's tokens: words, quoted strings, and each `{`, `}` and `,` on its own."""
    # Without quotes, braces or commas the tokens are the words (a listing's usual rule;
    # str.split is several times cheaper than the token pattern).
    if '"' in text or "{" in text or "}" in text or "," in text:
        return _TOKEN.findall(text)
    return text.split()


def _ip(tok: str):
    """An address/prefix/range token as a list of networks, or None."""
    if not _IPISH.fullmatch(tok) or ("." not in tok and ":" not in tok) or tok == ".":
        return None
    try:
        if "-" in tok and "/" not in tok:
            lo, hi = (ipaddress.ip_address(x) for x in tok.split("-", 1))
            return list(ipaddress.summarize_address_range(lo, hi))
        return [ipaddress.ip_network(tok, strict=False)]
    except ValueError:
        return None


def _net_text(n) -> str:
    # nft prints a full-length prefix as a plain address.
    return str(n.network_address) if n.prefixlen == n.max_prefixlen else str(n)


def _sort_key(text: str):
    head = text.split(" ", 1)[0]
    return (0, int(head), text) if head.isdigit() else (1, 0, text)


def _group(items: list, verbatim: bool) -> list:
    """Normalise one `{ … }` group; returns the token list to put in its place."""
    elems: list[list] = [[]]
    for t in items:
        if t == ",":
            elems.append([])
        else:
            elems[-1].append(t)
    elems = [e for e in elems if e]
    texts = [" ".join(_flat(e)) for e in elems]
    if verbatim:  # `update @set { ip saddr }`: a key expression, not a set
        return ["{", " , ".join(texts), "}"] if texts else ["{", "}"]
    is_map = any(":" in e for e in elems)
    if not is_map:
        nets = [_ip(t) for t in texts]
        if texts and all(n is not None for n in nets):
            # nft merges overlapping/adjacent intervals of an anonymous set.
            flat = [x for n in nets for x in n]
            merged = []
            for v in (4, 6):
                merged += list(ipaddress.collapse_addresses(x for x in flat if x.version == v))
            texts = [_net_text(n) for n in sorted(merged, key=lambda n: (n.version, n))]  # numeric, as nft
        else:
            texts = sorted(set(texts), key=_sort_key)
        if len(texts) == 1:
            return [texts[0]]  # a one-element anonymous set lists as the bare value
    else:
        texts = sorted(texts, key=_sort_key)
    return ["{ " + ", ".join(texts) + " }"]


def _flat(tokens: list) -> list:
    out = []
    for t in tokens:
        out.extend(t if isinstance(t, list) else [t])
    return out


def _nest(tokens: list[str]) -> list:
    """Turn `{ … }` runs into normalised group tokens (innermost first)."""
    out: list = []
    stack: list[list] = []
    for t in tokens:
        if t == "{":
            stack.append(out)
            out = []
        elif t == "}" and stack:
            items, out = out, stack.pop()
            verbatim = bool(out) and isinstance(out[-1], str) and out[-1].startswith("@")
            out.extend(_group(items, verbatim))
        else:
            out.append(t)
    while stack:  # unbalanced: leave as is
        items, out = out, stack.pop()
        out.extend(["{"] + items)
    return out


# Tokens canonical_rule treats by context (the others by their form alone, _token_form).
_CONTEXT = frozenset({"mark", "dnat", "snat", "meta", *_OPS})


@lru_cache(maxsize=65536)
def canonical_rule(text: str) -> str:
    """The normal form of a rule body (no comment), equal for our text and nft's listing."""
    toks = rule_tokens(text)
    forms = _FORMS
    out: list[str] = []
    i, n = 0, len(toks)
    while i < n:
        t = toks[i]
        form = forms.get(t)
        if form is None:
            form = _token_form(t)
        if form:  # an address that normalises, or (a hex number's form,)
            out.append(form if form.__class__ is str else form[0])
        elif t not in _CONTEXT:
            if t.isdigit() and len(out) >= 2 and out[-1] in ("!=", "==") and _HEX.fullmatch(out[-2]):
                out.append("0x%08x" % int(t))  # `mark and 0x4000 != 0`
            else:
                out.append(t)
        elif t == "mark":
            out += ("mark",) if out and out[-1] in ("meta", "ct") else ("meta", "mark")
        elif t in _OPS:
            out.append(_OPS[t])
        elif t == "dnat" or t == "snat":
            out.append(t)
            # `dnat ip addr . port to …` lists as `dnat ip to …`, which nft 0.9.8 cannot read
            # back: the normal form is the one every nft reads (a listing may be re-applied)
            if toks[i + 1 : i + 2] in (["ip"], ["ip6"]):
                if toks[i + 2 : i + 3] == ["to"]:
                    out += [toks[i + 1], "addr", ".", "port", "to"]
                    i += 2
                elif toks[i + 2 : i + 6] == ["addr", ".", "port", "to"]:
                    out += [toks[i + 1], "addr", ".", "port", "to"]
                    i += 5
        elif i + 2 < n and toks[i + 1] == "l4proto" and toks[i + 2] in PROTOCOL_NAMES:
            toks[i + 2] = PROTOCOL_NAMES[toks[i + 2]]  # `meta l4proto 6` (nft 0.9.8)
            continue
        elif i + 3 < n and toks[i + 1] == "l4proto" and toks[i + 2] in _L4 and toks[i + 3] == toks[i + 2]:
            i += 3  # `meta l4proto tcp tcp dport 80`: nft drops the implied dependency
            continue
        else:
            out.append(t)
        i += 1
    return " ".join(_nest(out) if "{" in out else out)


# token -> its normal form out of context: "" when it is its own, the new text when an
# address normalises, (form,) for a hex number. A listing repeats its keywords and
# addresses thousands of times: each is parsed once.
_FORMS: dict[str, object] = {}


_V4_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_V4 = re.compile(rf"{_V4_OCTET}(?:\.{_V4_OCTET}){{3}}")


def _token_form(t: str):
    if _HEX.fullmatch(t):
        form = ("0x%08x" % int(t, 16),)
    elif _V4.fullmatch(t) or (t.count(":") == 1 and "." in t):
        # an IPv4 address in nft's spelling lists as itself; `10.0.0.1:80` (one colon
        # and a dot) is no address: both without ipaddress's parse (or its exception)
        form = ""
    else:
        nets = _ip(t) if t not in ("{", "}", ",") else None
        form = _net_text(nets[0]) if nets and len(nets) == 1 else t
        if form == t:
            form = ""
    if len(_FORMS) < (1 << 17):
        _FORMS[t] = form
    return form
