"""``python -m oomload`` runs the CLI."""

from oomload.cli import main

raise SystemExit(main())
