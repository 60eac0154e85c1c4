"""Experience bank: a persistent store of successful episodes with dense top-J retrieval (SQLite + faiss)."""

from experience_bank.bank import ExperienceBank, texts_of
from experience_bank.records import Experience, trace_from_episode
from experience_bank.store import StoreError

__all__ = ["Experience", "ExperienceBank", "StoreError", "texts_of", "trace_from_episode"]
