"""Screenshots of `ember serve`'s page (GET /) for each inference method, for docs/serving.md.

    python benchmarks/tools/serve_screenshots.py                      # tiny runs built here -> docs/img/
    python benchmarks/tools/serve_screenshots.py --run classify=runs/sst2 --run generate=runs/gpt2-tiny

Each method's page is opened in Debian's headless Chromium (selenium + chromium-driver, as the
browser tests), its form filled with the example below, submitted, and the page saved as
``docs/img/serve-<method>.png``. Without ``--run`` the models are the tests' tiny runs (a small
BERT fine-tuned for one epoch on 256 SST-2 sentences, random NER / SQuAD 2.0 / MLM runs, a
random GPT-2 with a BPE trained on Wikipedia) and, for ``embed``, the real all-MiniLM-L6-v2
from the data folder when it is there: the pages are real, the tiny models' answers are not
meant to be good ones.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the browser and tiny-run helpers of the tests

# method -> the form's fields as a person would fill them in
EXAMPLES = {
    "classify": {"text": "an utterly charming and hilarious film that reaffirms your faith in cinema"},
    "embed": {"texts": "A man is playing a guitar.\nSomeone is playing an instrument.\n"
                       "The stock market fell sharply today.\nShare prices dropped."},
    "fill-mask": {"text": "the capital of france is [MASK] ."},
    "tag": {"text": "Angela Merkel met Emmanuel Macron in Berlin on Monday ."},
    "answer": {"question": "When was the tower built?",
               "context": "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was built for "
                          "the 1889 World's Fair and is named after the engineer Gustave Eiffel."},
    "generate": {"prompt": "The history of the city", "max_new_tokens": "20", "seed": "3"},
    "score": {"texts": "The city is on the river.\nriver the on is city The."},
}


def default_runs(work: Path) -> dict[str, Path]:
    """method -> run folder: the tests' tiny runs (and the real MiniLM for embed, if present)."""
    from api_helpers import tiny_runs
    from conftest import real_data

    from ember.paths import data_root
    from ember.tokenizers import train_tokenizer

    tok = train_tokenizer([real_data("wiki-en", "AA", "wiki_00.gz")], vocab_size=2000, max_documents=150,
                          progress=False)
    tok.save(str(work / "tokenizer.json"))
    runs = tiny_runs(work, work / "tokenizer.json")
    chosen = {"classify": runs["sst2"], "embed": runs["sst2"], "fill-mask": runs["mlm"], "tag": runs["conll2003"],
              "answer": runs["squad2"], "generate": runs["gpt"], "score": runs["gpt"]}
    minilm = data_root() / "checkpoints" / "all-MiniLM-L6-v2"
    if minilm.is_dir():
        from ember.api.sources import run_of_hf_folder

        chosen["embed"] = run_of_hf_folder(minilm)
    return chosen


def screenshot(driver, url: str, method: str, values: dict, out: Path) -> Path:
    from browser_helpers import fill, submit_and_wait

    driver.get(url + "/")
    for name, text in values.items():
        fill(driver, method, name, text)
    submit_and_wait(driver, method)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1100, max(600, min(height + 40, 2400)))
    path = out / f"serve-{method}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(1100, 900)
    return path


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", default=[], metavar="METHOD=RUN",
                        help="the run folder to show a method with (default: tiny runs built here)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"), help="folder for the PNGs (default docs/img)")
    parser.add_argument("--methods", default=",".join(EXAMPLES), help="comma-separated methods to shoot")
    args = parser.parse_args(argv)
    import torch

    from browser_helpers import chromium, missing_browser, serving

    reason = missing_browser()
    if reason:
        raise SystemExit(f"serve_screenshots: {reason}")
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    methods = [m for m in args.methods.split(",") if m]
    given = dict(item.split("=", 1) for item in args.run)
    written = []
    with tempfile.TemporaryDirectory(prefix="ember-screenshots-") as work, chromium() as driver:
        runs = {m: Path(p) for m, p in given.items()}
        if any(m not in runs for m in methods):
            runs = {**default_runs(Path(work)), **runs}
        for method in methods:
            with serving(runs[method]) as url:
                written.append(screenshot(driver, url, method, EXAMPLES[method], out))
            print(f"{method}: {written[-1]}")
    return written


if __name__ == "__main__":
    main()
