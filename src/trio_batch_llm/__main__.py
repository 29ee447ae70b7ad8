"""``python -m trio_batch_llm`` runs the command line."""

from .cli import main

raise SystemExit(main())
