"""TextWorld's memoised PDDL translation and parsing: fresh objects per call, a disk cache that survives a bad
file, and an ALFWorld game played through the memos exactly as without them."""

from __future__ import annotations

from environments.alfworld import textworld_memo
from environments.alfworld.env import AlfWorldEnv

from conftest import SHARED_DATA as DATA_ROOT


def test_a_memoised_parse_parses_each_string_once_and_hands_out_copies():
    calls = []

    def parse(text, rule_name=None):
        calls.append(text)
        return [{"symbol": text, "rule": rule_name}]

    memo = textworld_memo.memoised_parse(parse)
    first = memo("#intro#", rule_name="symbols")
    first[0]["symbol"] = "mutated by the caller"  # TextWorld writes back onto what a parse returns
    assert memo("#intro#", rule_name="symbols") == [{"symbol": "#intro#", "rule": "symbols"}]
    assert memo("#intro#", rule_name="other")[0]["rule"] == "other"  # keyword arguments are part of the key
    assert calls == ["#intro#", "#intro#"]


def test_memoised_pddl2sas_translates_once_across_processes_and_recovers_from_a_bad_cache_file(tmp_path):
    calls = []

    def translate(domain, problem, verbose=False, optimize=False):
        calls.append((problem, optimize))
        return {"task": [problem, optimize]}, f"sas of {problem}"

    memo = textworld_memo.memoised_pddl2sas(translate, cache_dir=tmp_path)
    task, sas = memo("(domain)", "(problem p1)")
    task["task"].append("mutated")
    assert memo("(domain)", "(problem p1)") == ({"task": ["(problem p1)", False]}, "sas of (problem p1)")
    memo("(domain)", "(problem p1)", optimize=True)
    assert calls == [("(problem p1)", False), ("(problem p1)", True)]
    other_process = textworld_memo.memoised_pddl2sas(translate, cache_dir=tmp_path)  # nothing in memory: the disk
    assert other_process("(domain)", "(problem p1)")[1] == "sas of (problem p1)" and len(calls) == 2
    for path in tmp_path.glob("*.pkl.z"):
        path.write_bytes(b"torn")
    fresh = textworld_memo.memoised_pddl2sas(translate, cache_dir=tmp_path)
    assert fresh("(domain)", "(problem p1)")[1] == "sas of (problem p1)" and len(calls) == 3  # translated again
    assert textworld_memo.memoised_pddl2sas(translate, cache_dir=tmp_path)("(domain)", "(problem p1)")
    assert len(calls) == 3  # and the rewritten file loads


def _play_walkthrough(env: AlfWorldEnv, task_id: str) -> list:
    obs, info = env.reset(options={"task_id": task_id})
    seen = [(obs, tuple(info["admissible_actions"]))]
    for action in info["task"].privileged["walkthrough"]:
        obs, reward, terminated, truncated, step = env.step(action)
        seen.append((action, obs, reward, tuple(step.get("admissible_actions") or env.admissible_actions() or ())))
        if terminated or truncated:
            break
    return seen


def test_a_game_through_the_memos_plays_exactly_as_without_them(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTGYM_OPD_CACHE", str(tmp_path))
    env = AlfWorldEnv("valid_unseen", data_root=DATA_ROOT)  # installs the memos
    import fast_downward
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as tw_logic

    task_id = env.task_ids()[0]
    fast_downward.pddl2sas.cache_clear()  # an earlier test in this process may hold this game's translations
    memoised = _play_walkthrough(env, task_id)
    again = _play_walkthrough(env, task_id)  # translations from memory, parses from the memo
    assert list((tmp_path / "alfworld-sas").glob("*.pkl.z"))  # kept on disk for the next process
    monkeypatch.setattr(fast_downward, "pddl2sas", fast_downward.pddl2sas.__wrapped_translate__)
    for module in (textgen, pddl_logic, tw_logic):
        monkeypatch.setattr(module, "_parse_and_convert", module._parse_and_convert.__wrapped_parse__)
    plain = _play_walkthrough(env, task_id)
    env.close()
    assert memoised == again == plain
    assert memoised[-1][2] == 1.0  # the walkthrough wins
