"""The model card (``README.md``) of a Hub folder: the Hub's YAML metadata header (languages, license, datasets,
a ``model-index`` of BLEU and chrF per test set), then the model in words.
"""

from __future__ import annotations

from typing import Any

import yaml

from nmt.model.attention import attention_class


def model_card(config: dict[str, Any], results: dict[str, Any] | None, card_license: dict[str, str],
               parameters: int, provenance: dict[str, Any], search: dict[str, Any]) -> str:
    """The card's text, from the training config, the recorded test results (None: unscored), the license metadata
    (``license``, with ``license_name`` and ``license_link`` when it is ``other``), provenance and the search
    options the folder decodes with (config.json's ``search``)."""
    data, attention = config.get("data") or {}, (config.get("attention") or {}).get("name", "?")
    src, tgt = data.get("src_lang", "?"), data.get("tgt_lang", "?")
    name = f"nmt-{src}-{tgt}-{attention}"
    header = {"language": [src, tgt], **card_license, "library_name": "nmt", "pipeline_tag": "translation",
              "tags": ["translation", "gru", "seq2seq", f"attention-{attention}"],
              "datasets": [data["corpus"]] if data.get("corpus") else []}
    if index := _index_results(results, data, src, tgt):  # the Hub refuses a model-index without results
        header["model-index"] = [{"name": name, "results": index}]
    body = [f"# {name}", "", _description(config, attention, parameters), "", "## Results", "",
            _results_table(results, search), "", "## Training config", "", "```yaml",
            yaml.safe_dump(config, sort_keys=False, allow_unicode=True).rstrip(), "```", "",
            "## How to use", "", "With the `nmt` package installed (this model's toolkit):", "", "```python",
            "from nmt import Translator", "",
            f'translator = Translator.from_pretrained("USER/{name}")  # a Hub repo id, or this folder\'s path',
            'print(translator.translate(["A sentence to translate."])[0].text)', "```", "",
            "or `python translate.py checkpoint=FOLDER input=FILE` and `python serve.py checkpoint=FOLDER` with the "
            "folder downloaded (`hf download USER/REPO --local-dir FOLDER`).", "",
            f"All three decode with beam {search['beam_size']}, length penalty {search['length_penalty']} "
            f"(`config.json`'s `search`) unless given other options (`beam_size=`, `length_penalty=`).", "",
            "## License", "", _license_text(card_license), "", "## Provenance", "",
            f"Exported {provenance['date']} by `{provenance['command']}` from checkpoint "
            f"sha256 `{provenance['sources'][0]['sha256']}`."]
    return f"---\n{yaml.safe_dump(header, sort_keys=False, allow_unicode=True)}---\n\n" + "\n".join(body) + "\n"


def _license_text(card_license: dict[str, str]) -> str:
    if "license_link" in card_license:  # license: other, with its terms' id and link
        return f"`other`: [{card_license['license_name']}]({card_license['license_link']})."
    return f"`{card_license['license']}`."


def _index_results(results: dict[str, Any] | None, data: dict[str, Any], src: str, tgt: str) -> list[dict]:
    """One model-index entry per test set, with BLEU and chrF and their sacrebleu signatures."""
    entries = []
    for test_set, scores in ((results or {}).get("test") or {}).items():
        metrics = [{"type": kind, "name": label, "value": round(float(scores[kind]), 2),
                    "args": {"sacrebleu_signature": scores.get(f"{kind}_signature")}}
                   for kind, label in (("bleu", "BLEU"), ("chrf", "chrF")) if kind in scores]
        entries.append({"task": {"type": "translation", "name": f"Translation {src}-{tgt}"},
                        "dataset": {"type": data.get("corpus") or "custom",
                                    "name": f"{data['corpus']} {test_set}" if data.get("corpus") else test_set,
                                    "split": test_set, "args": f"{src}-{tgt}"},
                        "metrics": metrics})
    return entries


def _description(config: dict[str, Any], attention: str, parameters: int) -> str:
    model = config.get("model") or {}
    try:
        # the docstring's first line names the paper and the score; what follows "; " is about the code
        formula = (attention_class(attention).__doc__ or "").strip().splitlines()[0].split("; ")[0]
        formula = formula.replace("``", "`").rstrip(".") + "."
    except ValueError:
        formula = ""
    return (f"A GRU encoder-decoder translation model (Bahdanau et al., 2015) trained with the `nmt` toolkit: "
            f"a bidirectional GRU encoder ({model.get('enc_layers')} layer(s), {model.get('enc_hidden_size')} units "
            f"per direction), an attentional GRU decoder ({model.get('dec_layers')} layer(s), "
            f"{model.get('dec_hidden_size')} units), embeddings of {model.get('emb_size')}, {parameters:,} parameters. "
            f"Attention: `{attention}`. {formula}")


def _results_table(results: dict[str, Any] | None, search: dict[str, Any]) -> str:
    tests = (results or {}).get("test") or {}
    if not tests:
        return "No test scores were recorded for this checkpoint."
    rows = ["| test set | BLEU | chrF | sacrebleu signature (BLEU) |", "| --- | --- | --- | --- |"]
    for name, s in tests.items():
        signature = str(s.get("bleu_signature", "")).replace("|", "\\|")  # a "|" ends a cell, even in backticks
        rows.append(f"| {name} | {s.get('bleu', float('nan')):.2f} | {s.get('chrf', float('nan')):.2f} | "
                    f"`{signature}` |")
    recorded = (results.get("beam_size"), results.get("length_penalty"))
    note = f"\n\nDecoded with beam {recorded[0]}, length penalty {recorded[1]}."
    if results.get("scored_as_shipped"):  # export.py score=true: measured on the folder, not its checkpoint
        note += f" Measured on this folder as shipped ({results['scored_as_shipped']} weights, its own search)."
    if recorded != (search["beam_size"], search["length_penalty"]):  # the folder was exported with another search
        note += (f" This folder decodes with beam {search['beam_size']}, length penalty {search['length_penalty']} "
                 "(below), which these scores do not measure.")
    return "\n".join(rows) + note

