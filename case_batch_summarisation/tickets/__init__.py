"""The night's input: synthetic support tickets as an OpenAI batch file (generator.py)."""
