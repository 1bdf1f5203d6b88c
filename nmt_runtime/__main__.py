"""``python -m nmt_runtime FOLDER``: sentences on stdin (UTF-8, one per line), translations on stdout.

A mistake the user can fix (a folder that is not an export, a missing file, invalid UTF-8, a model for
another language pair, an option out of range) ends in one line on stderr and exit status 2. With
``--n-best N`` (N > 1) a line holds ``text TAB score`` for each of the N best, as translate.py writes it.
The command writes no file: a stdout that is cut (a closed pipe, a full disk under ``> file``) ends in one line
on stderr and exit status 74, as translate.py's does.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from nmt_runtime.folder import ExportFolderError
from nmt_runtime.translator import Translation, Translator

PROGRAM = "nmt_runtime"
SEARCH_OPTIONS = ("beam_size", "length_penalty", "n_best", "max_len", "max_len_ratio", "batch_tokens")
# nmt.common.disk's EXIT_WRITE_STOPPED (sysexits.h's EX_IOERR): the job stopped mid-way, not a bad request (2).
# Repeated here because the runtime ships without the nmt package; the two must agree.
EXIT_WRITE_STOPPED = 74


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as for every other mistake
        fail(message)


def fail(message: str, status: int = 2) -> NoReturn:
    print(f"{PROGRAM}: error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def _ratio(text: str) -> float | None:
    return None if text.lower() in ("none", "null") else float(text)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    # search options left out stay out of the namespace: the folder's defaults apply
    parser = _Parser(prog=f"python -m {PROGRAM}", description="Translate stdin to stdout with an ONNX export.",
                     argument_default=argparse.SUPPRESS)
    parser.add_argument("folder", help="a folder written by export.py")
    parser.add_argument("--beam-size", type=int, help="1 = greedy (default: the folder's)")
    parser.add_argument("--length-penalty", type=float, help="GNMT alpha, 0-10")
    parser.add_argument("--n-best", type=int, help="> 1: 'text TAB score' for each of the n best")
    parser.add_argument("--max-len", type=int, help="at most this many output subwords")
    parser.add_argument("--max-len-ratio", type=_ratio, help="and at most ceil(ratio * source subwords) + 5; none")
    parser.add_argument("--batch-tokens", type=int, help="padded source subwords per batch")
    parser.add_argument("--src-lang", default=None, help="refuse a model that does not translate from this language")
    parser.add_argument("--tgt-lang", default=None, help="refuse a model that does not translate into this language")
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime threads (default: all cores)")
    return parser.parse_args(argv)


def read_lines(data: bytes) -> list[str]:
    """UTF-8 lines (only ``\\n`` ends one); invalid UTF-8 is refused naming the line."""
    raw_lines = data.split(b"\n")
    if raw_lines[-1] == b"":
        raw_lines.pop()  # the newline at the end of the input ends the last line, it does not start one
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise ExportFolderError(f"stdin, line {number}: invalid UTF-8 (byte {raw[error.start]:#04x} at column "
                                    f"{error.start + 1}); convert the input to UTF-8") from None
    return lines


def format_output(result: Translation, n_best: int) -> str:
    """translate.py's line: the text, or ``text TAB score`` pairs for ``n_best > 1``; "" for an empty input."""
    if not result.src_ids:
        return ""
    texts = [text.replace("\n", " ").replace("\t", " ") for text, _ in result.nbest]
    if n_best == 1:
        return texts[0]
    return "\t".join(f"{text}\t{score:.4f}" for text, (_, score) in zip(texts, result.nbest))


def write_stdout(lines: list[str]) -> None:
    """Write ``lines`` (each ending in a newline) to stdout; a cut stdout ends the command in one line and exit
    status 74 (translate.py's ``write_output`` does the same; the runtime cannot import it).
    """
    written = 0
    try:
        for line in lines:
            sys.stdout.write(line)
            written += 1  # handed to the buffer; how many reached the reader is not known
        sys.stdout.flush()
    except OSError as error:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush must not fail
        fail(f"could not write stdout: {error.strerror} (a closed pipe or a full disk); at most {written} of "
             f"{len(lines)} lines got out, and stdout cannot be taken back: redirect it to a file on a disk with "
             "room and run again", EXIT_WRITE_STOPPED)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"{PROGRAM}: %(message)s")
    options = {name: value for name, value in vars(args).items() if name in SEARCH_OPTIONS}
    try:
        translator = Translator(args.folder, threads=args.threads)
        for side, wanted, have in (("source", args.src_lang, translator.src_lang),
                                   ("target", args.tgt_lang, translator.tgt_lang)):
            if wanted is not None and wanted != have:
                raise ExportFolderError(f"{args.folder} translates {translator.src_lang}-{translator.tgt_lang}; "
                                        f"its {side} language is {have}, not {wanted}")
        results = translator.translate(read_lines(sys.stdin.buffer.read()), **options)
    except ExportFolderError as error:
        fail(str(error))
    n_best = options.get("n_best", translator.defaults.n_best)
    write_stdout([format_output(result, n_best) + "\n" for result in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
