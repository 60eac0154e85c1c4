"""SearchQA on the real HotpotQA dev/train files in ../shared/data: scoring, retrieval, cache, bad input.

The dense index (MiniLM over the paragraphs of the first 40 dev questions) is built once per session into a fresh cache dir, so
the test measures a real embedding pass and then proves the second env loads it from disk.
"""

from __future__ import annotations

import json
import time

import pytest
from gymnasium.utils.env_checker import check_env

import agentgym_opd
from agentgym_opd.core import EnvMisuseError, UnknownTaskError
from agentgym_opd.data import DataNotFoundError
from environments.searchqa.datasets import load_hotpotqa
from environments.searchqa.env import SearchQAEnv, parse_action
from environments.searchqa.qa_metrics import max_exact_match, max_token_f1, normalize_answer, token_f1
from environments.searchqa.retrievers import BM25Retriever, DenseRetriever


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("searchqa_cache")


@pytest.fixture(scope="session")
def dev(shared_data):
    return load_hotpotqa("dev", data_root=shared_data)


@pytest.fixture(scope="session")
def bm25_env(shared_data, cache_dir):
    return SearchQAEnv("dev", data_root=shared_data, cache_dir=cache_dir, retriever="bm25")


DENSE_QUESTIONS = 40  # the first 40 dev questions and their ~400 paragraphs: one real embedding pass


@pytest.fixture(scope="session")
def dense_dev(shared_data):
    return load_hotpotqa("dev", data_root=shared_data, limit=DENSE_QUESTIONS)


@pytest.fixture(scope="session")
def dense_index(dense_dev, cache_dir):
    _, passages = dense_dev
    start = time.perf_counter()
    retriever = DenseRetriever(passages, cache_dir=cache_dir)
    seconds = time.perf_counter() - start
    print(f"\n[searchqa] dense index over {len(passages)} dev passages built in {seconds:.1f}s")
    assert retriever.built_from_scratch
    return retriever


# ------------------------------------------------------------------------------------------ metrics
@pytest.mark.parametrize(
    "raw, normal",
    [("The Eiffel Tower!", "eiffel tower"), ("  an   Apple, a day ", "apple day"), ("U.S.A.", "usa"),
     ("Theatre of the Absurd", "theatre of absurd"), ("", "")],
)
def test_squad_normalisation(raw, normal):
    assert normalize_answer(raw) == normal


def test_exact_match_and_f1():
    assert max_exact_match("the Beatles", ["Beatles", "The Fab Four"]) == 1.0
    assert max_exact_match("Beatles band", "Beatles") == 0.0
    assert token_f1("Beatles band", "The Beatles") == pytest.approx(2 / 3)
    assert max_token_f1("Paris France", ["Paris", "Lyon"]) == pytest.approx(2 / 3)
    assert token_f1("yes indeed", "yes") == 0.0 and token_f1("no", "no") == 1.0
    with pytest.raises(ValueError):
        max_exact_match("x", [])


def test_parse_action_forms():
    assert parse_action("<think>hmm</think> <search> who founded Metroplex </search>") == ("search", "who founded Metroplex")
    assert parse_action("search: Juan Atkins") == ("search", "Juan Atkins")
    assert parse_action("I think so.\nAnswer: Belleville") == ("answer", "Belleville")
    assert parse_action("<answer>A</answer> <search>B</search>") == ("answer", "A")
    assert parse_action("<search>unclosed query") == ("search", "unclosed query")
    assert parse_action("just thinking aloud") is None


# -------------------------------------------------------------------------------------------- env
def test_registered_ids_and_data_root(shared_data, cache_dir, monkeypatch):
    ids = {spec.id for spec in agentgym_opd.registry.list_envs()}
    assert {"searchqa/hotpotqa", "searchqa/hotpotqa_dev", "searchqa/qa"} <= ids
    env = agentgym_opd.registry.make("searchqa/hotpotqa", data_root=shared_data, cache_dir=cache_dir)
    assert env.split == "train" and len(env.task_ids()) == 300
    monkeypatch.setenv("AGENTGYM_OPD_DATA", str(shared_data))
    assert len(SearchQAEnv("dev", cache_dir=cache_dir).task_ids()) == 300
    monkeypatch.delenv("AGENTGYM_OPD_DATA")
    with pytest.raises(DataNotFoundError, match="hotpotqa"):
        SearchQAEnv("dev", data_root=shared_data / "nowhere", cache_dir=cache_dir)


def test_gold_answers_score_one_and_walkthrough_succeeds(bm25_env):
    env = bm25_env
    for task_id in env.task_ids():
        env.reset(options={"task_id": task_id})
        answer = env.task.privileged["answer"][0]
        _, reward, terminated, truncated, info = env.step(f"<answer> {answer} </answer>")
        assert terminated and not truncated and reward == 1.0 and info["success"] and info["score"] == 1.0
    for task_id in env.task_ids()[:20]:
        _, info = env.reset(options={"task_id": task_id})
        task = info["task"]
        assert task.privileged["evidence"] and all(":" in e for e in task.privileged["evidence"])
        for action in task.privileged["walkthrough"]:
            obs, reward, terminated, truncated, info = env.step(action)
            assert info["error"] is None
        assert terminated and info["success"] and reward == 1.0


def test_wrong_answer_scores_zero_and_feedback_hides_gold(bm25_env):
    env = bm25_env
    for task_id in env.task_ids()[:30]:
        _, info = env.reset(options={"task_id": task_id})
        task = info["task"]
        gold = task.privileged["answer"][0]
        _, reward, terminated, _, info = env.step("answer: Zanzibar Quuxville")
        assert terminated and reward == 0.0 and not info["success"] and info["score"] == 0.0
        assert "did not match" in info["feedback"] and "never searched" in info["feedback"]
        if not any(gold.lower() in t.lower() for t in task.metadata["supporting_titles"]):
            assert gold.lower() not in info["feedback"].lower(), (gold, info["feedback"])
    # a partly right answer gets F1 credit, no success
    env.reset(options={"task_id": env.task_ids()[0]})  # gold: "Tulsa"
    _, reward, _, _, info = env.step("<answer>Tulsa, Oklahoma</answer>")
    assert reward == 0.0 and 0 < info["score"] < 1 and "partly right" in info["feedback"]


def test_search_observation_and_limits(shared_data, cache_dir):
    env = SearchQAEnv("dev", data_root=shared_data, cache_dir=cache_dir, max_turns=3, max_searches=1, top_k=2)
    env.reset(options={"task_id": env.task_ids()[0]})
    obs, reward, terminated, truncated, info = env.step("<search> Tinted Windows debut album </search>")
    assert obs.startswith("<information>") and obs.endswith("</information>") and "Doc 1 (Title: Tinted Windows" in obs
    assert "Doc 2" in obs and "Doc 3" not in obs and info["error"] is None and not terminated
    obs, *_, info = env.step("search: first performance of the band")
    assert info["error"].kind == "invalid_action" and "Answer now" in obs
    obs, reward, terminated, truncated, info = env.step("<think>still unsure</think>")
    assert truncated and not terminated and info["error"].kind == "parse_error"
    assert "no answer within 3 turns" in info["feedback"] and "supporting passages were about 'Tinted Windows (album)'" in info["feedback"]
    with pytest.raises(EnvMisuseError):
        env.step("<answer> Tulsa </answer>")
    with pytest.raises(UnknownTaskError):
        env.reset(options={"task_id": "no-such-question"})


@pytest.mark.parametrize(
    "action, kind",
    [("", "parse_error"), ("   ", "parse_error"), ("x" * 10_000, "parse_error"), ("\udcff\x00", "parse_error"),
     ("I am not sure what to do.", "parse_error"), ("<search>   </search>", "parse_error"),
     ("<answer></answer>", "parse_error")],
)
def test_bad_input_is_a_step_error_and_env_keeps_working(bm25_env, action, kind):
    env = bm25_env
    env.reset(options={"task_id": env.task_ids()[1]})
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["error"] is not None and info["error"].kind == kind and not terminated and reward == 0.0
    assert obs and env.observation_space.contains(obs)
    gold = env.task.privileged["answer"][0]
    _, reward, terminated, _, info = env.step(f"<answer>{gold}</answer>")
    assert terminated and reward == 1.0


def test_check_env_passes(bm25_env):
    check_env(bm25_env, skip_render_check=True)


# ------------------------------------------------------------------------------------- retrieval
def _recall_any(retriever, examples, k):
    found = sum(any(p.title in e.supporting_titles for p, _ in retriever.search(e.question, k)) for e in examples)
    return found / len(examples)


def test_bm25_retrieves_a_supporting_passage(bm25_env, dev):
    examples, _ = dev
    recall = _recall_any(bm25_env.retriever, examples[:150], 5)
    print(f"[searchqa] bm25 any-supporting recall@5 = {recall:.2f}")
    assert recall >= 0.8


@pytest.mark.slow
def test_dense_retrieves_a_supporting_passage(dense_index, dense_dev):
    examples, _ = dense_dev
    recall = _recall_any(dense_index, examples, 5)
    print(f"[searchqa] dense any-supporting recall@5 = {recall:.2f}")
    assert recall >= 0.7


@pytest.mark.slow
def test_dense_env_reuses_the_cached_index(dense_index, shared_data, cache_dir):
    start = time.perf_counter()
    env = SearchQAEnv("dev", data_root=shared_data, cache_dir=cache_dir, retriever="dense",
                      limit=DENSE_QUESTIONS)
    seconds = time.perf_counter() - start
    assert not env.retriever.built_from_scratch and env.retriever.index_dir == dense_index.index_dir
    print(f"[searchqa] second dense env created from the cache in {seconds:.2f}s")
    env.reset(options={"task_id": env.task_ids()[0]})
    obs, *_ = env.step("<search> debut album of the band Tinted Windows </search>")
    assert "Tinted Windows (album)" in obs


def test_bm25_cache_is_keyed_by_corpus(dev, cache_dir):
    _, passages = dev
    first = BM25Retriever(passages, cache_dir=cache_dir)
    again = BM25Retriever(passages, cache_dir=cache_dir)
    other = BM25Retriever(passages[:50], cache_dir=cache_dir)
    assert not again.built_from_scratch and again.index_dir == first.index_dir
    assert other.built_from_scratch and other.index_dir != first.index_dir
    assert [p.id for p, _ in again.search("Tinted Windows band", 3)] == [p.id for p, _ in first.search("Tinted Windows band", 3)]


# ----------------------------------------------------------------------------- generic datasets loader
def test_hf_loader_with_local_jsonl_and_corpus(tmp_path, cache_dir):
    qa = tmp_path / "trivia.jsonl"
    corpus = tmp_path / "passages.jsonl"
    qa.write_text("\n".join(json.dumps(r) for r in [
        {"qid": "q1", "query": "Which river flows through Vienna?", "answer": {"aliases": ["Danube", "Donau"], "value": "Danube"}},
        {"qid": "q2", "query": "What is the capital of Peru?", "answer": {"aliases": ["Lima"], "value": "Lima"}},
    ]) + "\n")
    corpus.write_text("\n".join(json.dumps(r) for r in [
        {"id": "p1", "title": "Vienna", "text": "Vienna lies on the Danube river in Austria."},
        {"id": "p2", "title": "Lima", "text": "Lima is the capital and largest city of Peru."},
        {"id": "p3", "title": "Oslo", "text": "Oslo is the capital of Norway."},
    ]) + "\n")
    env = agentgym_opd.registry.make("searchqa/qa", qa_path=str(qa), corpus_path=str(corpus), question_field="query",
                                     answer_field="answer", id_field="qid", cache_dir=cache_dir)
    assert env.task_ids() == ["q1", "q2"]
    obs, info = env.reset(options={"task_id": "q1"})
    assert "Which river flows through Vienna?" in obs and info["task"].privileged["answer"] == ["Danube", "Donau"]
    obs, *_ = env.step("<search> river Vienna </search>")
    assert "Doc 1 (Title: Vienna)" in obs
    _, reward, terminated, _, info = env.step("<answer> the Donau </answer>")
    assert terminated and reward == 1.0 and info["success"]
    with pytest.raises(ValueError, match="corpus_path"):
        SearchQAEnv(dataset="hf", qa_path=str(qa), question_field="query", id_field="qid", cache_dir=cache_dir)
