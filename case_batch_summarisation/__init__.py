"""Case study 2: overnight batch summarisation of support tickets (README.md)."""
