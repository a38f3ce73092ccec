"""OpenAI batch files through the offline engine: `python -m shared_engine run-batch -i IN -o OUT`."""
