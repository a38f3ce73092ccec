"""`make demo`: the RAG chatbot end to end on this machine.

Prepares the default model (SmolLM2-135M-Instruct), ingests the corpus into the embedded Chroma store
(skipped when it is up to date), starts the engine (`python -m shared_engine serve`) and the app
(`python -m case_rag_chatbot.app serve`) on free local ports, asks three questions through the app's
streaming `/chat`, prints each answer as it streams with its sources, TTFT, output tokens/s and the
prefix-cache hit, then stops both servers. The system prompt is cut to 1,024 tokens (the scaled-down CPU
setting; the brief's 4k prompt is for the GPU).

    python -m case_rag_chatbot.demo [--max-tokens 128] [--system-prompt-tokens 1024]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
ENGINE_FLAGS = ("--max-model-len", "4096", "--kv-cache-memory", str(512 * 1024**2))


@dataclass(frozen=True)
class DemoQuestion:
    text: str
    expected_source: str  # a docs.python.org page and anchor that a retrieved source must start with


QUESTIONS = [
    DemoQuestion("How do I catch several exception types in one except clause?",
                 "https://docs.python.org/{v}/reference/compound_stmts.html#"),
    DemoQuestion("What does the else clause of a for loop do?",
                 "https://docs.python.org/{v}/reference/compound_stmts.html#for"),
    DemoQuestion("Which values count as false when an object is tested in an if statement?",
                 "https://docs.python.org/{v}/library/stdtypes.html#truth"),
]


@dataclass
class Service:
    name: str
    url: str
    proc: subprocess.Popen
    log_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(name: str, cmd: list[str], port: int, log_dir: Path,
                  env: dict[str, str | None] | None = None, timeout_s: float = 300) -> Service:
    """Start `cmd` (environment: ours, updated by `env`, where None unsets) and wait until
    `http://127.0.0.1:{port}/health` answers 200.

    Raises:
        RuntimeError: the process exited or did not become healthy in `timeout_s` (the log's tail included).
    """
    log_path = log_dir / f"{name}-{port}.log"
    full_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_WAIT_POLICY": "PASSIVE"}
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    service = Service(name, f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(service.url + "/health", timeout=2).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    service.stop()
    raise RuntimeError(f"{name} did not become healthy in {timeout_s:.0f} s:\n{log_path.read_text()[-3000:]}")


def start_engine(log_dir: Path, *flags: str) -> Service:
    """`python -m shared_engine serve` on the default model (flags default to `ENGINE_FLAGS`)."""
    port = free_port()
    cmd = [sys.executable, "-m", "shared_engine", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--uvicorn-log-level", "warning", *(flags or ENGINE_FLAGS)]
    return start_service("engine", cmd, port, log_dir)


def start_app(log_dir: Path, engine_url: str, env: dict[str, str | None] | None = None) -> Service:
    """`python -m case_rag_chatbot.app serve --no-ingest` against `engine_url` (the engine's root URL), on
    the embedded Chroma store unless `env` sets CHROMA_URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "case_rag_chatbot.app", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--no-ingest"]
    app_env = {"ENGINE_URL": engine_url + "/v1", "SYSTEM_PROMPT_TOKENS": "1024", "CHROMA_URL": None, **(env or {})}
    return start_service("app", cmd, port, log_dir, env=app_env)


def expected_source(question: DemoQuestion) -> str:
    return question.expected_source.format(v=f"{sys.version_info.major}.{sys.version_info.minor}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--system-prompt-tokens", type=int, default=1024)
    args = parser.parse_args(argv)
    from shared_engine.model_loader.default_model import default_model_dir

    from .app.__main__ import run_ingest
    from .app.client import ask
    from .app.settings import AppSettings

    started = time.perf_counter()
    print("The default model is SmolLM2-135M-Instruct on the CPU: expect fluent, often wrong answers. The demo\n"
          "shows the serving path: retrieval and its sources, streaming, and the system prompt served from\n"
          "the engine's prefix cache.\n", flush=True)
    print(f"== model: {default_model_dir()}", flush=True)
    settings = AppSettings.from_env({k: v for k, v in os.environ.items() if k != "CHROMA_URL"})
    print("== ingest", flush=True)
    run_ingest(settings)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="rag-demo-") as logs:
        print("== starting the engine and the app", flush=True)
        engine = start_engine(Path(logs))
        stack.callback(engine.stop)
        app = start_app(Path(logs), engine.url, {"SYSTEM_PROMPT_TOKENS": str(args.system_prompt_tokens),
                                                  "CHROMA_DIR": str(settings.chroma_dir)})
        stack.callback(app.stop)
        print(f"   engine {engine.url}, app {app.url} (chat page: {app.url}/)", flush=True)
        for question in QUESTIONS:
            print(f"\n>>> {question.text}\n", flush=True)
            answer = ask(app.url, question.text, on_text=lambda t: print(t, end="", flush=True),
                         max_tokens=args.max_tokens)
            if answer.error:
                print(f"\n!! {answer.error['message']}")
                return 1
            done, usage = answer.done, answer.done.get("usage", {})
            print("\n\nSources:")
            for s in answer.sources:
                print(f"  [{s['n']}] {s['title']}: {s['source']}")
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            print(f"TTFT {done['ttft_ms']:.0f} ms (retrieval {done['retrieval_ms']:.0f} ms), "
                  f"{done['output_tokens_per_s'] or 0:.1f} output tokens/s, {usage.get('completion_tokens')} "
                  f"output tokens, {usage.get('prompt_tokens')} prompt tokens of which {cached} from the "
                  f"prefix cache", flush=True)
    print(f"\nDemo finished in {time.perf_counter() - started:.0f} s; engine and app stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
