"""Which rules of a Lark grammar never end: empty languages of several shapes are found with
their rules named, and grammars whose language is not empty (recursive ones with a base
case, ones using llguidance's extensions, GBNF conversions) never are."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import llguidance
import pytest
from llguidance import LLMatcher

from infer.engine.structured.grammar_productivity import (
    describe_empty_language,
    empty_language_rules,
)

ENDLESS = 'a: "x" a\nb: "y" b\n'

EMPTY_LANGUAGES = [
    ("a choice of endless rules", "start: a | b\n" + ENDLESS, ["start", "a", "b"]),
    ("a prefix, then the choice", 'start: "p" (a | b)\n' + ENDLESS, ["start", "a", "b"]),
    ("the choice repeated", "start: (a | b)+\n" + ENDLESS, ["start", "a", "b"]),
    (
        "a choice reached through rules",
        'start: "p" c | d\nc: a\nd: c "q"\n' + ENDLESS,
        ["start", "c", "d", "a"],
    ),
    ("mutual recursion", 'start: "s" a\na: "x" b | "y" a\nb: a "z"\n', ["start", "a", "b"]),
    ("a repetition that needs one", 'start: a{2,3} | a~1\na: "x" a\n', ["start", "a"]),
    ("left recursion only", 'start: start "x" | a\na: a "y"\n', ["start", "a"]),
    (
        "GBNF",
        llguidance.grammar_from("grammar", 'root ::= a-b | c\na-b ::= "x" a-b\nc ::= "y" c\n'),
        ["start", "a_b", "c"],
    ),
    (
        "a GBNF repetition",
        llguidance.grammar_from("grammar", 'root ::= x{2,5} | "q" x\nx ::= "a" x\n'),
        ["start", "x"],
    ),
]

# Each uses llguidance's extensions with ``start`` also needing an endless ``e``: found
# empty, they show the extension was read (and counted as ending) rather than given up on.
EXTENSIONS = {
    "options header": '%llguidance {"no_forcing": true}\nstart: "x" EXTRA\n',
    "special tokens": "start: <|endoftext|> <[12]> <[100-200,300]> <[^150]> <[*]> EXTRA\n",
    "inline JSON schema": 'start: j EXTRA\nj: %json {"type": "object", "pattern": "}{"}\n',
    "structured regex": 'start: R EXTRA\nR: %regex {"substring_words": "a b"}\n',
    "attributes": 'start: t EXTRA\nt[capture, stop=",", max_tokens=5]: /[a-z]+/\n',
    "lazy and suffix": 'start: t u EXTRA\nt[lazy]: /.*x/\nu[suffix="]"]: /[0-9]+/\n',
    "repetition ranges": 'start: "x"{3} "y"{,2} "z"{1,} /a/{2,5} EXTRA\n',
    "comments": 'start: "x" EXTRA # hash\n// slashes\n',
    "dashes in names": "start: my-rule EXTRA\nmy-rule: MY-TOKEN\nMY-TOKEN: /a/\n",
    "terminal algebra": "start: T EXTRA\nT: /[a-z]+/ & ~/(?s:.*)ab(?s:.*)/\n",
    "imports and ignore": "%import common.NUMBER\n%ignore /[ \\t]+/\nstart: NUMBER EXTRA\n",
    "inline and pinned rules": 'start: p q EXTRA\n?p: "x"\n!q: "y"\n',
    "aliases": 'start: a EXTRA\na: "x" -> named\n',
    "parametric rules": 'start: perm::0x0 EXTRA\nperm::_: "" %if is_ones([0:2])\n'
    '  | "a" perm::set_bit(0) %if bit_clear(0)\n  | "b" perm::set_bit(1) %if bit_clear(1)\n',
    "string ranges and flags": 'start: "a".."z" "Q"i EXTRA\n',
    "multi-line alternatives": 'start: "x" EXTRA\n     | "y" EXTRA\n     | "z" EXTRA\n',
}


@pytest.mark.parametrize(("shape", "grammar", "rules"), EMPTY_LANGUAGES)
def test_an_empty_language_names_the_rules_that_never_end(
    shape: str, grammar: str, rules: list[str]
) -> None:
    assert not LLMatcher.validate_grammar(grammar), shape
    assert empty_language_rules(grammar) == rules, shape


@pytest.mark.parametrize("extension", list(EXTENSIONS))
def test_grammars_with_llguidance_extensions_are_read(extension: str) -> None:
    grammar = EXTENSIONS[extension]
    ending = grammar.replace("EXTRA", '"."')
    endless = grammar.replace("EXTRA", "e") + 'e: "e" e\n'
    assert not LLMatcher.validate_grammar(ending), extension
    assert not LLMatcher.validate_grammar(endless), extension
    assert empty_language_rules(ending) == []
    assert empty_language_rules(endless)[0] == "start"
    assert "e" in empty_language_rules(endless)


NON_EMPTY = [
    'start: a | b\na: "x" a | "z"\nb: "y" b\n',  # one choice has a base case
    'start: a\na: "(" a ")" | ""\n',
    'start: expr\nexpr: expr "+" term | term\nterm: term "*" factor | factor\n'
    'factor: "(" expr ")" | NUMBER\nNUMBER: /[0-9]+/\n',
    'start: "p" (a | "q")\na: "x" a\n',  # the group's other choice ends
    'start: a* b? [c] a{0,3} a{,2}\na: "x" a\nb: "y" b\nc: "z" c\n',  # optional endless rules
    "start: <|endoftext|>\n",
    "start: @subgrammar\n",
    "start: t\nt[lazy]: /.*x/\n",
    'start: perm::0x0\nperm::_: "" %if is_ones([0:1])\n  | "a" perm::set_bit(0) %if bit_clear(0)\n',
    llguidance.grammar_from(
        "grammar", 'root ::= list\nlist ::= item ("," item)*\nitem ::= [a-z]+\n'
    ),
    llguidance.grammar_from("grammar", 'root ::= "a" root | "b"\n'),
    llguidance.grammar_from(  # JSON in GBNF: recursion through values, arrays and objects
        "grammar",
        'root ::= value\nvalue ::= object | array | string | number | "true" | "null"\n'
        'object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}"\n'
        'array ::= "[" ws ( value ("," ws value)* )? "]"\n'
        'string ::= "\\"" [^"\\\\]* "\\""\nnumber ::= "-"? [0-9]+ ("." [0-9]+)?\n'
        "ws ::= [ \\t\\n]{0,20}\n",
    ),
    llguidance.grammar_from("json", {"$ref": "#"}),  # JSON: llguidance's first mask judges it
    llguidance.grammar_from("regex", "a+"),
    llguidance.grammar_from("choice", ["yes", "no"]),
]


@pytest.mark.parametrize("grammar", NON_EMPTY)
def test_a_grammar_whose_language_is_not_empty_is_never_rejected(grammar: str) -> None:
    assert empty_language_rules(grammar) == []


@pytest.mark.parametrize(
    "grammar",
    [
        "start: a\na: b\n",  # b undefined (llguidance refuses it): assumed to end
        "start: a\n%declare a\n",  # a statement llguidance does not support
        'start: "x" ?? %%\n',  # not a grammar at all
        'start: %json {"unclosed": \n',
        "start: " + "(" * 200 + '"x"' + ")" * 200 + "\n",  # nested beyond what it follows
        'start: a\na: "x" a\n_t{x}: x\n',  # templates (llguidance refuses them)
    ],
)
def test_what_is_not_understood_is_assumed_to_end(grammar: str) -> None:
    assert empty_language_rules(grammar) == []


def test_long_chains_are_judged_in_linear_time() -> None:
    """5,000 chained rules defined top-down, only the last one ending: a pass over the rules
    per rule found productive would take minutes, not a fraction of a second."""
    n = 5_000
    chain = "start: r0\n" + "".join(f'r{i}: "a" r{i + 1} | "b" r{i + 1}\n' for i in range(n))
    began = time.perf_counter()
    assert empty_language_rules(chain + f'r{n}: "end"\n') == []
    assert time.perf_counter() - began < 10
    endless = empty_language_rules(chain + f'r{n}: "x" r{n}\n')
    assert endless[:3] == ["start", "r0", "r1"]
    assert len(endless) == n + 2


def test_the_description_names_the_rules_and_stays_short() -> None:
    assert describe_empty_language(["start", "a", "b"]) == (
        "rules start, a, b never end (each of their alternatives needs one of them)"
    )
    many = describe_empty_language([f"r{i}" for i in range(100)])
    assert "r9 and 90 more" in many
    assert "r10" not in many


@dataclass
class _Item:
    """One item of a generated alternative: a terminal, a rule, or a group with an operator."""

    kind: str  # "terminal", "rule", "group", "maybe"
    rule: int = 0
    group: list[list[_Item]] | None = None
    op: str = ""


def _random_grammar(rng: random.Random) -> tuple[list[list[list[_Item]]], list[str]]:
    """Rules as alternatives of items, and how each is named in the text."""
    count = rng.randint(1, 6)
    names = ["start"] + [rng.choice(["r{}", "rule-{}", "_r{}"]).format(i) for i in range(1, count)]

    def alternatives(depth: int) -> list[list[_Item]]:
        return [
            [item(depth) for _ in range(rng.randint(1 if depth else 0, 3))]
            for _ in range(rng.randint(1, 3))
        ]

    def item(depth: int) -> _Item:
        kinds = ["terminal", "rule", "rule", "rule"] + ["group", "maybe"] * (depth < 2)
        kind = rng.choice(kinds)
        if kind == "rule":
            return _Item("rule", rule=rng.randrange(count))
        if kind in ("group", "maybe"):
            op = rng.choice(["", "+", "*", "?", "{2,3}", "{0,2}", "{2}", "{,2}", "{1,}", "~1"])
            return _Item(kind, group=alternatives(depth + 1), op=op if kind == "group" else "")
        return _Item("terminal")

    rules = [alternatives(0) for _ in range(count)]
    return rules, names


def _render(rules: list[list[list[_Item]]], names: list[str], rng: random.Random) -> str:
    terminals = ['"x"', "/[a-z]+/", "WORD", "<|endoftext|>", '%json {"type": "integer"}']

    def alternatives(alts: list[list[_Item]], separator: str) -> str:
        return separator.join(" ".join(item(i) for i in alt) or '""' for alt in alts)

    def item(i: _Item) -> str:
        if i.kind == "terminal":
            return rng.choice(terminals)
        if i.kind == "rule":
            return names[i.rule]
        assert i.group is not None
        inner = alternatives(i.group, " | ")
        return f"[{inner}]" if i.kind == "maybe" else f"({inner}){i.op}"

    lines = [rng.choice(["", "%llguidance {}\n", "// a comment\n"])]
    for name, alts in zip(names, rules, strict=True):
        prefix = rng.choice(["", "?", "!"]) if name != "start" else ""
        attributes = rng.choice(["", "[capture]"])
        separator = rng.choice([" | ", "\n    | "])
        lines.append(f"{prefix}{name}{attributes}: {alternatives(alts, separator)}\n")
    lines.append("WORD: /[a-z]+/ # a terminal\n")
    return "".join(lines)


def _naive_productive(rules: list[list[list[_Item]]]) -> set[int]:
    """Productivity by passes until nothing changes: slow, and plainly right."""
    productive: set[int] = set()

    def ends(alts: list[list[_Item]]) -> bool:
        return any(all(item_ends(i) for i in alt) for alt in alts)

    def item_ends(i: _Item) -> bool:
        if i.kind == "terminal":
            return True
        if i.kind == "rule":
            return i.rule in productive
        assert i.group is not None
        optional = i.kind == "maybe" or i.op in ("*", "?", "{0,2}", "{,2}")
        return optional or ends(i.group)

    changed = True
    while changed:
        grown = {r for r, alts in enumerate(rules) if ends(alts)}
        changed = grown != productive
        productive = grown
    return productive


def test_random_grammars_agree_with_a_plain_fixed_point() -> None:
    """Generated grammars in llguidance's dialect (each one it accepts): the verdict is the
    plain fixed point's, and the rules named are ones that never end."""
    rng = random.Random(43)
    judged = empty = 0
    for _ in range(400):
        rules, names = _random_grammar(rng)
        text = _render(rules, names, rng)
        if LLMatcher.validate_grammar(text):
            continue
        judged += 1
        productive = _naive_productive(rules)
        found = empty_language_rules(text)
        if 0 in productive:
            assert found == [], text
        else:
            empty += 1
            assert found[0] == "start", text
            assert {names.index(n) for n in found} <= set(range(len(rules))) - productive, text
    assert judged > 300
    assert 50 < empty < judged - 50  # both verdicts well represented
