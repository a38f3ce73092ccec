"""Case study 3: a coding agent on long context (issue 21). See README.md."""
