"""Evaluation and leaderboards: run agents on env suites, score with CIs, publish Markdown / HTML.

* :mod:`~relax_gym.leaderboards.agents` -- agents named by spec strings (``oracle``,
  ``openai:URL``, ``sglang:URL``, ``hf:PATH``, ``python:module:callable``...);
* :mod:`~relax_gym.leaderboards.eval_runner` -- concurrent, resumable episode runner writing
  ``episodes.jsonl``, ``summary.json``, transcripts and media files;
* :mod:`~relax_gym.leaderboards.scoring` -- bootstrap CIs, pass@k / pass^k, normalised scores;
* :mod:`~relax_gym.leaderboards.store` -- the SQLite results index;
* :mod:`~relax_gym.leaderboards.render_md` / :mod:`~relax_gym.leaderboards.render_html` --
  the published pages; :mod:`~relax_gym.leaderboards.boards` -- the boards and their suites.

Importing this package is light (no torch, no transformers); model agents load what they need
when they are built.
"""

from .agents import Agent, AgentOptions, FatalAgentError, ModalityRejected, make_agent
from .config import EvalConfig, plan
from .records import EpisodeRecord, read_records
from .eval_runner import EvalRunner, RunError, RunResult, run_eval
from .scoring import Baseline, Estimate, pass_at_k, pass_hat_k

__all__ = [
    "Agent",
    "AgentOptions",
    "Baseline",
    "EpisodeRecord",
    "Estimate",
    "EvalConfig",
    "EvalRunner",
    "FatalAgentError",
    "ModalityRejected",
    "RunError",
    "RunResult",
    "make_agent",
    "pass_at_k",
    "pass_hat_k",
    "plan",
    "read_records",
    "run_eval",
]
