"""A log line as the grammar reads it (`grammar`): terminal colour codes and backspaces, a
launcher's or logger's prefix (`[rank0]: `, `[1,0]<stdout>:`, timestamps, `[INFO]`, `LAUNCH
INFO`, `train.py:42 -`) and a tqdm bar it was glued to dropped; numpy's `array(...)`, torch's
`tensor(...)` and numpy 2's `np.float32(...)` read as their data; a Paddle dygraph Tensor print
(`Tensor(shape=.., dtype=.., place=.., stop_gradient=..,` then its data and `)`) joined onto
the line it was printed on; and the 16-bit type a print names (`half_dtype`). Numpy-free.
"""

from __future__ import annotations

import re

from .grammar import is_array_content
from .lines import strip_bars

_PREFIX = re.compile(  # what a launcher or logger writes before a line; never part of it
    r"^(?:\s*(?:\[[A-Za-z_]*\d+\]:"  # torchrun and friends: [rank0]: [default0]:
    r"|\[\d+,\d+\]<std(?:out|err)>:"  # mpirun --tag-output
    r"|\[?\d{4}[-/]\d\d[-/]\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?"
    r"|\[?(?:\d\d/\d\d\s+)?\d\d:\d\d:\d\d(?:[.,]\d+)?\]?"  # mmengine's `11/22 10:00:00`
    r"|\[\s*(?:INFO|DEBUG)\s*\]|(?:LAUNCH\s+)?(?:INFO|DEBUG)(?::[\w.]+:|\b)"
    r"|I\d{4}\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+\d+\s+[\w./-]+\.py:\d+\]"  # absl's INFO, a .py's
    r"|[\w.-]+\.py:\d+\b:?|-(?=\s)))+\s*"
)
_RANK = re.compile(r"^\s*(?:\[(?P<tag>[A-Za-z_]*\d+)\]:|\[\d+,(?P<mpi>\d+)\]<std)")
_TENSOR = re.compile(  # Paddle's Tensor header; its data follows on the next line
    r"^(?P<before>.*?)\b(?:Tensor|Parameter)\(shape=\[[\d,\s]*\],\s*dtype=[\w.]+,"
    r".*\bstop_gradient=(?:True|False),(?:.*,)?\s*$"
)
_PARAMETER = "Parameter containing:"  # str() of a Paddle parameter: this line, then the Tensor
# numpy's repr: array([...], dtype=float32); `, dtype=` tried where its white space begins only
_REPR = re.compile(r"\barray\(|,\s*+dtype=[\w.]+\)|(?<![\s,])\s*+dtype=[\w.]+\)")
_WRAPPED = re.compile(  # torch's tensor(1.79, device='cuda:0', ..), numpy 2's np.float32(1.79),
    # JAX's Array(1.79, dtype=float32, weak_type=True), TF's tf.Tensor(1.79, shape=(), dtype=..)
    r"(?:\b(?:tensor|Array|DeviceArray|np\.(?:float|int|uint)\d*)|\btf\.Tensor)\("
    r"\s*+(?P<data>\[?\s*+[-+\w.]+\s*+\]?)\s*+(?:,(?:[^()]|\([\d,\s]*\))*)?\)"
)
_TF_REPR = re.compile(r"<tf\.Tensor:[^<>]*\bnumpy=(?P<data>[-+\w.]+)>")  # `<tf.Tensor: ...>`
_CALLED = re.compile(  # an f-string's `{loss.item()=}`: the value's name as the key
    r"(?<=\w)(?:\.(?:item|numpy|cpu|detach|tolist|float)\(\))+(?=\s*[=:])"
)
_HALF = re.compile(
    r"(?:\bdtype\s*=\s*['\"]?(?:(?:paddle|torch|np|numpy|jnp|tf)\.)?|\bnp\.)"
    r"(?P<kind>float16|bfloat16|half)\b"
)
# full-width punctuation, as a Chinese input method types it: `step: 3，loss：2.3`
_FULL_WIDTH = str.maketrans("：，；（）【】［］　", ":,;()[][] ")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\ufeff|\x08+")  # colour codes, a BOM, backspaces
# numbers, brackets, commas and white space only: no prefix, colour code, bar or wrapper can be
# in it (each needs a `:`, `%`, `(`, a letter other than those of `e`, `nan`, `inf`, or a
# control character), so `clean` has nothing to drop but the ends' white space
_PLAIN = re.compile(r"[\d\s.eE+\-\[\],naif]*")


def clean(line: str) -> str:
    """A line without terminal colour codes and backspaces (its full-width punctuation read as
    ASCII's), a launcher's or logger's prefix, a
    progress bar it was glued to (`lines.strip_bars`), numpy's
    `array(..., dtype=...)`, numpy 2's `np.float32(...)`, torch's `tensor(..., device=...)`,
    JAX's `Array(...)` and TF's `tf.Tensor(...)` wrappers, an f-string's `loss.item()=` call
    (the key `loss=`) and surrounding white space."""
    if _PLAIN.fullmatch(line) and not _dash_prefix(line):  # most of a printed array's lines
        return line.strip()
    text = _PREFIX.sub("", _ANSI.sub("", line).translate(_FULL_WIDTH))
    if "[" in text and (unbarred := strip_bars(text)) != text and unbarred.strip():
        text = _PREFIX.sub("", unbarred)  # a line glued after tqdm's bar; a bar alone is noise
    if "(" in text:  # torch's wrapper first: its `dtype=...)` is not numpy's
        text = _CALLED.sub("", _WRAPPED.sub(r"\g<data>", text))
    if "<tf." in text:
        text = _TF_REPR.sub(r"\g<data>", text)
    return _REPR.sub("", text).strip()


def _dash_prefix(line: str) -> bool:
    """Whether the line starts with a lone `-` (a logger's prefix, `_PREFIX`)."""
    text = line.lstrip()
    return text[:1] == "-" and text[1:2].isspace()


def half_dtype(line: str) -> str | None:
    """The 16-bit type a print on the line names (`dtype=float16`, `dtype=paddle.bfloat16`,
    `dtype=torch.float16`, numpy 2's `np.float16(...)`): 'float16' or 'bfloat16', else None. Its
    values are known no closer than that type's spacing, whatever digits they print."""
    if "16" not in line:
        return None
    match = _HALF.search(line)
    return None if match is None else "bfloat16" if match["kind"] == "bfloat16" else "float16"


def rank_tag(line: str) -> str | None:
    """The process a launcher tagged the line with (`[rank1]: ` gives 'rank1'), if any."""
    match = _RANK.match(_ANSI.sub("", line))
    return None if match is None else match["tag"] or f"rank{match['mpi']}"


def readable(lines: list[str]) -> list[str]:
    """A log's lines as the grammar reads them: each `clean`, Tensor prints joined
    (`join_tensors`) and records of one field per line joined (`join_fields`); line numbers
    stay."""
    return join_fields(lines, join_tensors([clean(line) for line in lines]))


# a record's head: bracketed fields ending the line, `:` after them or not (Composer's
# `[epoch=1][batch=3/16]:`, OLMo's `[step=3/100,epoch=0]` after its logger's prefix): a line
# that ends with one (any bracketed text before a `:`, else one holding a `=`), matched as that
# last one alone (matched as a run of them from each `[`, a long line of them took cubic time)
_HEADER = re.compile(r"\[[^\[\]:]+\]:$|\[[^\[\]:=]*=[^\[\]:]*\]$")
# one field: `Train loss/train/total: 2.2974`, `train/CE loss=2.29`, `throughput/TPS=1,234`
_FIELD = re.compile(
    r"(?P<name>[^\s:,=][^:,=]*?)(?<!\s)\s*+(?P<sep>[:=])\s*+(?P<value>[^\s:,=]+|\d{1,3}(?:,\d{3})+)"
)


def join_fields(raw: list[str], lines: list[str]) -> list[str]:
    """Clean lines with each record printed one field per line under a header read as one line:
    the header, then its fields separated by commas. The header is the bracketed fields that
    end a line (Composer's ConsoleLogger: `[epoch=1][batch=3/16]:`, then indented `Train
    loss/train/total: 2.29` lines; OLMo's: `[step=3/100,epoch=0]`, then indented
    `train/CrossEntropyLoss=2.29` lines); only indented lines of one `name: value` or
    `name=value` each are its fields (a value's thousands separators dropped: `1,234`). The
    lines moved up become empty."""
    out = list(lines)
    for at, line in enumerate(out):
        if not line.endswith(("]", ":")) or not _HEADER.search(line):
            continue
        end, fields = at + 1, []
        while end < len(out) and raw[end][:1] in (" ", "\t"):
            field = _FIELD.fullmatch(out[end])
            if field is None:
                break
            value = field["value"].replace(",", "")
            fields.append(f"{field['name']}{field['sep']} {value}")
            end += 1
        if fields:
            out[at] = f"{line} {', '.join(fields)}"
            out[at + 1 : end] = [""] * (end - at - 1)
    return out


def join_tensors(lines: list[str]) -> list[str]:
    """Clean lines with each Paddle Tensor print read as its data: the text before
    `Tensor(shape=.., stop_gradient=..,` (or before `Parameter containing:`) continues with the
    data's first line, and the `)` after the data goes. Line numbers stay: the lines moved up
    become empty. A Tensor whose data never closes is left for the reader to refuse."""
    out = list(lines)
    for at, line in enumerate(out):
        head = _TENSOR.match(line) if "(shape=" in line else None
        if head is None:
            continue
        before = head["before"]
        if not before and at and out[at - 1].endswith(_PARAMETER):
            before, out[at - 1] = out[at - 1][: -len(_PARAMETER)], ""
        data = next((i for i in range(at + 1, len(out)) if out[i]), None)
        if data is None:
            return out
        out[at], out[data] = f"{before.strip()} {out[data]}".strip(), ""
        _drop_closing(out, at, len(before.strip()))
    return out


def _drop_closing(lines: list[str], at: int, start: int) -> None:
    """Drop the `)` that closes the Tensor whose data starts at `lines[at][start:]`: the first
    one where its brackets balance, over the lines that hold array content."""
    depth, text = 0, lines[at][start:]
    for i in range(at, len(lines)):
        if i > at:
            text = lines[i]
            if not is_array_content(text.removesuffix(")")):
                continue  # a line printed into the middle of the data
        depth += text.count("[") - text.count("]")
        if depth <= 0:  # the `)` after the data's last `]` (a 0-d Tensor's: after its number)
            line, begin = lines[i], start if i == at else 0
            close = line.find(")", max(begin, line.rfind("]") + 1))
            if close >= 0:  # fields may follow it: `loss: Tensor(..., 2.12), lr: 0.04`
                lines[i] = (line[:close] + line[close + 1 :]).rstrip()
            return
