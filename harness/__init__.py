"""harness: an ablation harness for multi-turn agentic RL of language models."""

__version__ = "0.1.0"
