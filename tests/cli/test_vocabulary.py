"""One command-line vocabulary: a flag means one thing in every command (its metavar is the
CLI's, VOCABULARY), no retired spelling is accepted, every flag has help, and help shows every
default."""

import argparse

import pytest

from fbnas._cli import VOCABULARY, HelpFormatter, build_parser

RETIRED = {"--target", "--bands", "--report", "--sample-seed"}


def _parsers():
    def walk(parser, path):
        yield " ".join(path), parser
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    yield from walk(sp, [*path, name])
    return list(walk(build_parser(), ["fbnas"]))


PARSERS = _parsers()


def _options(parser):
    return [a for a in parser._actions
            if a.option_strings and not isinstance(a, (argparse._HelpAction,
                                                       argparse._VersionAction))]


@pytest.mark.parametrize("where, parser", PARSERS, ids=[w for w, _ in PARSERS])
def test_every_flag_has_help_its_default_and_the_one_meaning(where, parser):
    fmt = HelpFormatter(where)
    for a in _options(parser):
        flag = a.option_strings[-1]
        assert a.help, f"{where} {flag}: no help"
        assert flag not in RETIRED, f"{where} {flag}: a retired spelling"
        if flag in VOCABULARY:
            assert a.metavar == VOCABULARY[flag], (where, flag, a.metavar)
        if a.default not in (None, False, [], argparse.SUPPRESS):
            assert "default" in fmt._get_help_string(a), f"{where} {flag}: default not shown"
    for a in parser._actions:
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction):
            assert a.help, f"{where} {a.dest}: no help"


def test_the_same_objects_are_passed_by_the_same_flag():
    flags = {o for _, p in PARSERS for a in _options(p) for o in a.option_strings}
    assert {"--table", "--bench", "--targets", "--retrain-seeds", "--json"} <= flags
    # `--out` is a folder wherever it is taken
    outs = [(w, a.metavar) for w, p in PARSERS for a in _options(p) if "--out" in a.option_strings]
    assert len(outs) >= 7 and {m for _, m in outs} == {"DIR"}, outs


def test_a_command_that_strays_from_the_vocabulary_is_refused(monkeypatch):
    from fbnas._cli import space

    real = space.add_parser

    def stray(sub):
        real(sub)
        sub.choices["space"].add_argument("--out", metavar="FILE", help="x")

    monkeypatch.setattr(space, "add_parser", stray)
    with pytest.raises(AssertionError, match="fbnas space --out: metavar 'FILE'"):
        build_parser()


def test_help_shows_a_default_and_hides_a_test_only_choice(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["latency", "build", "--help"])
    out = capsys.readouterr().out
    assert "(default: 12)" in out and "fake" not in out  # --probes; the fake timer
