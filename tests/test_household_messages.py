"""The household env's error sentences: one full stop where a reason meets the next sentence."""

from __future__ import annotations

from agentgym_opd import make
from environments.household.commands import as_sentence


def test_an_unknown_verb_error_has_no_double_full_stop():
    env = make("household/train")
    env.reset(seed=1)
    for action in ("fly to the moon", "go to moon 1", "take moon 1 from table 1"):
        *_, info = env.step(action)
        message = info["error"].message
        assert ".." not in message and message.endswith("in this state."), message
    *_, info = env.step("fly to the moon")
    assert "inventory. The admissible_actions" in info["error"].message


def test_as_sentence_capitalises_and_ends_once():
    assert as_sentence("you are already at table 1") == "You are already at table 1."
    assert as_sentence("'fly' is not a command here. Commands: look.") == "'fly' is not a command here. Commands: look."
    assert as_sentence("really?") == "Really?" and as_sentence("") == ""
