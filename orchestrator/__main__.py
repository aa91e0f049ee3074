"""`python -m orchestrator`: the command line, which lives in orchestrator/cli/."""

from orchestrator.cli.main import main

if __name__ == "__main__":
    main()
