"""Which rules of a Lark grammar (llguidance's dialect) can never end: a rule is productive
when one of its alternatives consists only of productive items (terminals, optional or ``*``
items, productive rules), and the grammar's language is empty when ``start`` is not.

llguidance reports an empty language only when its first mask has nothing but the end of
sequence; ``start: a | b`` with ``a: "x" a`` and ``b: "y" b`` offers "x" and "y" there and
runs until ``length``. llguidance exposes no parsed rules, and the ``lark`` package's loader
rejects its extensions (the ``%llguidance {}`` header of every GBNF conversion, ``{M,N}``,
``<special>`` tokens, ``%json``, attributes), so this module reads the text with the token
patterns and structure of llguidance's own parser (``parser/src/lark/{lexer,parser}.rs``).

The analysis over-approximates: terminals, special tokens, ``%json``, subgrammars, names it
does not know and parametric conditions all count as productive, and any text it does not
understand yields no verdict. So it never rejects a grammar whose language is non-empty.
"""

from __future__ import annotations

import json
import re
from collections import deque

# llguidance's lexemes, longest first where two could start alike (llguidance's lexer takes
# the longest match; a Python alternation takes the first, so the order stands in for it).
_LEXEMES = re.compile(
    r"""
    (?P<skip>(?:\#|//)[^\n]*|[ \t]+)
    |(?P<newline>(?:\r?\n)+[ \t]*)
    |(?P<string>"(?:\\(?:["\\/bfnrt]|u[a-fA-F0-9]{4}|x[a-fA-F0-9]{2})|[^"\\\x00-\x1f\x7f])*"i?)
    |(?P<regexp>/(?:\\.|[^/\\])+/[imslux]*)
    |(?P<keyword>%(?:declare|llguidance|ignore|import|override|json|regex|lark|if))
    |(?P<arrow>->)
    |(?P<hex>0[xX][0-9a-fA-F]+)
    |(?P<number>[+-]?[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)
    |(?P<rule>!?[_?]?[a-z][_a-z0-9\-]*)
    |(?P<token>_?[A-Z][_A-Z0-9\-]*)
    |(?P<special><[^<>\s]+>)
    |(?P<grammar_ref>@[a-zA-Z0-9_\-]+)
    |(?P<op>[+*?])
    |(?P<punct>::|\.\.|[:,.(){}\[\]~|&=_])
    """,
    re.VERBOSE,
)
# What follows these keywords is one JSON value, read by a JSON decoder as llguidance does.
_JSON_KEYWORDS = ("%json", "%regex", "%llguidance")
_JSON_WHITESPACE = " \t\n\r"
_END_OF_EXPANSION = {"newline", "|", "->", "}", ")", "]", "&", "%if", "end"}
_CLOSING = {"(": ")", "[": "]", "{": "}"}
# Nesting of groups deeper than this is left unjudged (the parser recurses on it).
_MAX_NESTING = 64
_MAX_NAMED = 10

# A node of the analysis: a rule by name, or a group of one (an int).
Node = str | int


class _NotUnderstood(Exception):
    """Text this module does not follow: no verdict on the grammar."""


def empty_language_rules(grammar: str) -> list[str]:
    """The rules that ``start`` needs and that never end, ``start`` first, when the language
    of ``grammar`` (Lark text, llguidance's dialect) is empty; [] when it may not be, or when
    the text is not understood (llguidance's JSON grammars included)."""
    if grammar.lstrip().startswith("{"):
        return []
    try:
        alternatives = _Parser(_lexemes(grammar)).parse()
    except (_NotUnderstood, RecursionError):
        return []
    if "start" not in alternatives:
        return []
    productive = _productive(alternatives)
    if "start" in productive:
        return []
    return _needed_from_start(alternatives, productive)


def describe_empty_language(rules: list[str]) -> str:
    """Why the language of a grammar whose ``rules`` never end is empty, in a line."""
    named = ", ".join(rules[:_MAX_NAMED])
    if len(rules) > _MAX_NAMED:
        named += f" and {len(rules) - _MAX_NAMED} more"
    return f"rules {named} never end (each of their alternatives needs one of them)"


def _lexemes(text: str) -> list[tuple[str, str]]:
    """``text`` as (kind, text) pairs: kind is the text itself for punctuation, operators and
    keywords, else the lexeme's class (``rule``, ``token``, ``string``, ``newline`` ...)."""
    lexemes: list[tuple[str, str]] = []
    position = 0
    decoder = json.JSONDecoder()
    while position < len(text):
        match = _LEXEMES.match(text, position)
        if match is None:
            raise _NotUnderstood(f"no lexeme at {position}")
        kind, value = match.lastgroup or "", match.group()
        position = match.end()
        if kind == "skip":
            continue
        if kind in ("keyword", "punct", "arrow"):
            kind = value
        if kind in _JSON_KEYWORDS:
            while position < len(text) and text[position] in _JSON_WHITESPACE:
                position += 1
            try:
                _, position = decoder.raw_decode(text, position)
            except ValueError as exc:
                raise _NotUnderstood(f"{kind} is not followed by JSON") from exc
        lexemes.append((kind, value))
    return lexemes


class _Parser:
    """A grammar's rules as alternatives of needed nodes, following llguidance's parser.
    Each rule or group maps to its alternatives; an alternative lists the nodes (rules, or
    groups that need something) it needs, all of them, to end. An empty one always ends."""

    def __init__(self, lexemes: list[tuple[str, str]]) -> None:
        # Two ends, so that the parser may look one lexeme past the last.
        self.kinds = [kind for kind, _ in lexemes] + ["end", "end"]
        self.values = [value for _, value in lexemes] + ["", ""]
        self.position = 0
        self.nesting = 0
        self.groups = 0
        self.alternatives: dict[Node, list[list[Node]]] = {}

    def parse(self) -> dict[Node, list[list[Node]]]:
        while self.kind() != "end":
            if self.take("newline"):
                continue
            if self.kind() == "rule":
                self.rule()
            elif self.kind() == "token":
                self.terminal()
            else:
                self.statement()
        return self.alternatives

    def kind(self, ahead: int = 0) -> str:
        return self.kinds[self.position + ahead]

    def take(self, kind: str) -> str | None:
        if self.kinds[self.position] != kind:
            return None
        self.position += 1
        return self.values[self.position - 1]

    def expect(self, kind: str) -> str:
        value = self.take(kind)
        if value is None:
            raise _NotUnderstood(f"expected {kind}, found {self.kind()}")
        return value

    def rule(self) -> None:
        name = self.expect("rule").lstrip("!?")
        if self.take("::"):  # parametric: every instance stands as one rule, all alternatives
            self.expect("_")
        if self.kind() == "{":
            raise _NotUnderstood("templates")  # llguidance refuses them
        if self.take("."):
            self.expect("number")
        if self.kind() == "[":  # attributes (capture, lazy, stop=...): no bearing on ending
            self.skip_balanced()
        self.expect(":")
        self.alternatives.setdefault(name, []).extend(self.expansions())

    def terminal(self) -> None:
        """A terminal's definition, read past: terminals count as productive (llguidance
        reports an empty regex at the first mask)."""
        self.expect("token")
        if self.kind() == "{":
            self.skip_balanced()
        if self.take("."):
            self.expect("number")
        self.expect(":")
        self.expansions()

    def statement(self) -> None:
        if self.take("%ignore"):
            self.expansions()
        elif self.take("%import"):  # terminals of llguidance's ``common``
            while self.kind() not in ("newline", "end"):
                self.position += 1
        elif not self.take("%llguidance"):  # its JSON options were read with it
            raise _NotUnderstood(f"statement {self.kind()}")

    def expansions(self) -> list[list[Node]]:
        self.nesting += 1
        if self.nesting > _MAX_NESTING:
            raise _NotUnderstood("nested too deeply")
        alternatives = [self.alias()]
        while self.take("|") or (self.kind() == "newline" and self.kind(1) == "|"):
            self.take("newline")
            self.take("|")
            alternatives.append(self.alias())
        self.nesting -= 1
        return alternatives

    def alias(self) -> list[Node]:
        needed = self.expansion()
        while self.take("&"):  # an intersection ends only if each part does
            needed += self.expansion()
        if self.take("->"):
            self.expect("rule")
        if self.take("%if"):  # a parametric condition, taken as true
            self.skip_call()
        return needed

    def expansion(self) -> list[Node]:
        needed: list[Node] = []
        while self.kind() not in _END_OF_EXPANSION:
            needed += self.expr()
        return needed

    def expr(self) -> list[Node]:
        needed = self.atom()
        if op := self.take("op"):
            return needed if op == "+" else []
        if self.kind() == "~" and self.kind(1) == "number":
            self.take("~")
            least = _count(self.expect("number"))
            if self.take(".."):
                self.expect("number")
            return needed if least > 0 else []
        if self.take("{"):  # {M,N}, {N}, {,N}, {M,}
            least = 0 if self.kind() == "," else _count(self.expect("number"))
            if self.take(","):
                self.take("number")
            self.expect("}")
            return needed if least > 0 else []
        return needed

    def atom(self) -> list[Node]:
        if self.take("~"):  # a complement may be non-empty whatever it complements
            self.atom()
            return []
        if self.take("("):
            alternatives = self.expansions()
            self.expect(")")
            return self.group(alternatives)
        if self.take("["):
            self.expansions()
            self.expect("]")
            return []
        return self.value()

    def group(self, alternatives: list[list[Node]]) -> list[Node]:
        if any(not needed for needed in alternatives):
            return []
        self.groups += 1
        self.alternatives[self.groups] = alternatives
        return [self.groups]

    def value(self) -> list[Node]:
        kind = self.kind()
        if self.take("string"):
            if self.take(".."):
                self.expect("string")
            return []
        if kind in ("regexp", "grammar_ref", "special", "%json", "%regex"):
            self.position += 1
            return []
        if self.take("%lark"):  # a nested grammar, left unjudged
            if self.kind() != "{":
                raise _NotUnderstood("%lark without {")
            self.skip_balanced()
            return []
        name = self.take("rule")
        if name is None:
            self.expect("token")  # terminals count as productive
            if self.kind() == "{" and self.kind(1) not in (",", "number"):
                self.skip_balanced()
            return []
        if self.kind() == "{" and self.kind(1) not in (",", "number"):
            self.skip_balanced()  # a template's use: llguidance refuses templates
            return []
        if self.take("::"):
            self.skip_call()
        return [name]

    def skip_call(self) -> None:
        """A parameter expression or condition: ``_``, a number, ``name`` or ``name(...)``."""
        if self.take("rule") and self.kind() != "(":
            return
        if self.kind() == "(":
            self.skip_balanced()
        elif self.kind() in ("_", "number", "hex"):
            self.position += 1

    def skip_balanced(self) -> None:
        """From an opening bracket past its closing one."""
        if self.kind() not in _CLOSING:
            raise _NotUnderstood(f"expected a bracket, found {self.kind()}")
        closing = [_CLOSING[self.kind()]]
        self.position += 1
        while closing:
            kind = self.kind()
            if kind == "end":
                raise _NotUnderstood("unbalanced brackets")
            self.position += 1
            if kind in _CLOSING:
                closing.append(_CLOSING[kind])
            elif kind == closing[-1]:
                closing.pop()


def _count(number: str) -> int:
    try:
        return int(number)
    except ValueError:
        raise _NotUnderstood(f"count {number}") from None


def _productive(alternatives: dict[Node, list[list[Node]]]) -> set[Node]:
    """The nodes that may end, found in time linear in the grammar: each alternative counts
    the distinct nodes it still waits on, and a node that turns productive releases them.
    A rule used but not defined counts as productive (llguidance refuses such grammars)."""
    waiting: list[int] = []
    owners: list[Node] = []
    waiters: dict[Node, list[int]] = {}
    ready: deque[Node] = deque()
    productive: set[Node] = set()
    for node, options in alternatives.items():
        for needed in options:
            known = {n for n in needed if n in alternatives}
            index = len(waiting)
            waiting.append(len(known))
            owners.append(node)
            for n in known:
                waiters.setdefault(n, []).append(index)
            if not known and node not in productive:
                productive.add(node)
                ready.append(node)
    while ready:
        for index in waiters.get(ready.popleft(), ()):
            waiting[index] -= 1
            owner = owners[index]
            if waiting[index] == 0 and owner not in productive:
                productive.add(owner)
                ready.append(owner)
    return productive


def _needed_from_start(
    alternatives: dict[Node, list[list[Node]]], productive: set[Node]
) -> list[str]:
    """The named rules that never end and that ``start`` needs, nearest first."""
    seen: set[Node] = {"start"}
    order: deque[Node] = deque(["start"])
    named: list[str] = []
    while order:
        node = order.popleft()
        if isinstance(node, str):
            named.append(node)
        for needed in alternatives.get(node, ()):
            for n in needed:
                if n in alternatives and n not in productive and n not in seen:
                    seen.add(n)
                    order.append(n)
    return named
