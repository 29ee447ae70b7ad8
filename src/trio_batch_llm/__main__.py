"""``python -m trio_batch_llm`` runs the command line."""

from ._cli._main import main

raise SystemExit(main())
