"""orchestrator: deploy and restart SGLang (EAGLE-3) servers on GPU hosts, declaratively."""

__version__ = "0.1.0"
