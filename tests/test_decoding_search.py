"""What a search finds: beam search against exhaustive search on models whose next-token
distributions are written down, never below greedy on random models, no special token in any
output, and the rules every pick obeys (<unk> penalty, no repeated n-grams, sources ended by </s>)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor, nn

import tfbuilder
from conftest import tiny_model
from tfbuilder.inference import decoding
from tfbuilder.data.collate import pad
from tfbuilder.inference.decoding import Rules
from tfbuilder.spec.recipe import ModelSection
from tfbuilder.specials import BOS, EOS, MASK, OWN, PAD, UNK, SpecialIds

REAL = (5, 6, 7)  # the ordinary tokens of the written-down models; <unk> may be generated too
VOCAB = 8


class TableModel(nn.Module):
    """A translation model whose next-token logits depend only on the position: ``table[t]`` (the
    table's rows beyond its end repeat its last). Its source is ignored."""

    pad_id = PAD
    specials = OWN

    def __init__(self, table: Tensor):
        super().__init__()
        self.register_buffer("table", table.float())

    def encode(self, src: Tensor) -> tuple[Tensor, None]:
        return src[:, :, None].float(), None

    def new_cache(self) -> list[dict]:
        return [{}]

    def decode(self, tgt: Tensor, memory: Tensor, memory_mask, *, cache=None, offset: int = 0) -> Tensor:
        row = self.table[min(offset, len(self.table) - 1)]
        return row.expand(tgt.shape[0], 1, -1)


def exhaustive_best(
    table: Tensor, *, limit: int, alpha: float, nbest: int = 1, min_len: int = 1
) -> list[tuple[float, list[int]]]:
    """Every output of at least ``min_len`` and at most ``limit`` tokens (</s> counted) over the tokens a
    decoder may emit (the ordinary ones and <unk>), scored by its log-probability over the GNMT length
    penalty: the ``nbest`` best."""
    logp = table.float().log_softmax(-1).tolist()
    scored = []
    for n in range(min(min_len, limit - 1), limit):
        for seq in itertools.product((UNK, *REAL), repeat=n):
            total = sum(logp[t][w] for t, w in enumerate(seq)) + logp[n][EOS]
            scored.append((total / ((5 + n + 1) / 6) ** alpha, list(seq)))
    return sorted(scored, key=lambda s: -s[0])[:nbest]


def trap(limit: int = 6) -> Tensor:
    """The trap of a small vocabulary: an early </s> is always among the best few candidates
    (log-probability about -9), beside one confident long output (5 6 7 5, near 0), while
    <pad>, <s> and <mask> are likelier than anything else at some steps."""
    table = torch.full((limit, VOCAB), -12.0)
    for t, w in enumerate([5, 6, 7, 5]):
        table[t, w] = 3.0
        table[t, EOS] = -6.0
    table[4, EOS] = 3.0
    table[1, MASK] = table[2, BOS] = table[3, PAD] = 3.5
    return table


def slow_start(limit: int = 6) -> Tensor:
    """An uncertain first token (</s> the likeliest single choice: 0.4 against 0.22, 0.2 and 0.18 for
    5, 6 and 7), then near-certain tokens up to the limit. Every live hypothesis has lost as much as it ever
    will after one step; under a strong length penalty (alpha 1.5) one that grows to the limit beats
    the early </s>, which beats it at its present length: a search that stops when no live hypothesis
    can win at its next length, not at the longest it may reach, ends with the empty output."""
    table = torch.full((limit, VOCAB), -12.0)
    table[0, [EOS, 5, 6, 7]] = torch.tensor([0.4, 0.22, 0.2, 0.18]).log()
    for t in range(1, limit - 1):
        table[t, REAL[t % 3]] = 10.0
    table[limit - 1, EOS] = 10.0
    return table


@pytest.mark.parametrize("beam", [2, 4, 8])  # a beam of one is greedy search (tests/test_decoding.py)
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
@pytest.mark.parametrize("min_len", [1, 0])
def test_beam_search_finds_the_exhaustive_best(beam, alpha, min_len):
    limit = 6
    rules = Rules(min_len=min_len)
    tables = [trap(limit), slow_start(limit)] + [torch.randn(limit, VOCAB, generator=torch.Generator().manual_seed(s)) * 3 for s in range(4)]
    src = torch.tensor([[5, EOS]])
    for table, nbest in itertools.product(tables, (1, min(beam, 3))):  # the stopping bar: the best ended, or the nbest-th
        model = TableModel(table)
        got = decoding.beam_search_nbest(model, src, beam=beam, nbest=nbest, alpha=alpha, max_len_a=0, max_len_b=limit, rules=rules)[0]
        want = exhaustive_best(table, limit=limit, alpha=alpha, nbest=nbest, min_len=min_len)
        assert [h for _, h in got] == [h for _, h in want]
        assert [s for s, _ in got] == pytest.approx([s for s, _ in want], abs=1e-5)
    # The trap: the confident long output, not an early </s>.
    assert decoding.beam_search(TableModel(trap(limit)), src, beam=beam, alpha=alpha, max_len_a=0, max_len_b=limit, rules=rules) == [[5, 6, 7, 5]]
    # The slow start: under alpha 1.5 the output that grows to the limit, not the early </s>; with a
    # minimum length of 1 (the default), never the empty output.
    grown = decoding.beam_search(TableModel(slow_start(limit)), src, beam=beam, alpha=alpha, max_len_a=0, max_len_b=limit, rules=rules)
    assert grown == ([[5, 6, 7, 5, 6]] if alpha == 1.5 or min_len else [[]])


class MarkovTable(TableModel):
    """Logits that depend on the position and the last token: ``table[t, last]``."""

    def decode(self, tgt: Tensor, memory: Tensor, memory_mask, *, cache=None, offset: int = 0) -> Tensor:
        return self.table[min(offset, len(self.table) - 1)][tgt[:, -1]][:, None]


def test_the_greedy_path_stays_in_the_beam():
    """Beam 2 would drop the greedy prefix 5 5 at the second step (5 6... and 6 6... score higher
    there) and end worse than greedy; kept in the beam, it ends best."""
    A, B, C = REAL
    table = torch.full((4, VOCAB, VOCAB), -9.0)
    table[0, BOS, [A, B, C]] = torch.tensor([2.0, 1.5, 1.4])
    table[1, A, [UNK, A, B, C]] = torch.tensor([0.85, 1.0, 0.95, 0.9])
    table[1, B, [B, C]] = 2.0
    table[2, A, EOS] = 9.0
    table[2, [B, C]] = 0.0  # a flat distribution: every continuation costs log(8)
    table[3, :, EOS] = 9.0
    model = MarkovTable(table)
    logp = table.log_softmax(-1)
    step1 = {(A, w): float(logp[0, BOS, A] + logp[1, A, w]) for w in (A, B, C)}
    step1.update({(B, w): float(logp[0, BOS, B] + logp[1, B, w]) for w in (B, C)})
    assert sorted(step1, key=step1.get, reverse=True)[:2] == [(B, B), (B, C)]  # the greedy prefix (A, A) is third
    src = torch.tensor([[5, EOS]])
    assert decoding.greedy(model, src, max_len_a=0, max_len_b=4) == [[A, A]]
    assert decoding.beam_search(model, src, beam=2, alpha=0.0, max_len_a=0, max_len_b=4) == [[A, A]]


def normalised(model: nn.Module, row: Tensor, hyp: list[int], alpha: float) -> float:
    """The length-normalised log-probability of ``hyp`` followed by </s>."""
    with torch.no_grad():
        logp = model(row[None], torch.tensor([[BOS, *hyp]]))[0].log_softmax(-1)
    total = sum(float(logp[t, w]) for t, w in enumerate([*hyp, EOS]))
    return total / ((5 + len(hyp) + 1) / 6) ** alpha


@pytest.mark.parametrize("seed", range(2))
def test_beam_search_never_scores_below_greedy(seed):
    torch.manual_seed(seed)
    spec = tiny_model(vocab_size=12)  # a small vocabulary: early </s> candidates abound
    model = tfbuilder.build_model(ModelSection.model_validate(spec)).eval()
    src = pad([torch.randint(5, 12, (n,)).tolist() for n in (1, 4, 7, 2, 6)], eos=True)
    greedy = decoding.greedy(model, src, max_len_a=0, max_len_b=8)
    for alpha in (0.0, 0.6):
        for beam in range(1, 9):
            found = decoding.beam_search_nbest(model, src, beam=beam, alpha=alpha, max_len_a=0, max_len_b=8)
            for row, g, ((score, hyp),) in zip(src, greedy, found):
                assert score == pytest.approx(normalised(model, row, hyp, alpha), abs=1e-4)
                assert score >= normalised(model, row, g, alpha) - 1e-5, (beam, alpha, hyp, g)


class Prefers(nn.Module):
    """A model of either kind that prefers ``tokens`` above everything at every step."""

    def __init__(self, kind: str, tokens: list[int], specials: SpecialIds = OWN):
        super().__init__()
        self.kind, self.pad_id, self.specials = kind, PAD, specials
        self.bias = torch.zeros(VOCAB)
        self.bias[tokens] = 8.0
        self.bias[EOS] = -1.0

    def _logits(self, n: int, width: int, offset: int) -> Tensor:
        noise = torch.randn(n, width, VOCAB, generator=torch.Generator().manual_seed(offset))
        return noise + self.bias

    def encode(self, src: Tensor) -> tuple[Tensor, None]:
        return src[:, :, None].float(), None

    def new_cache(self) -> list[dict]:
        return [{}]

    def decode(self, tgt: Tensor, memory: Tensor, memory_mask, *, cache=None, offset: int = 0) -> Tensor:
        return self._logits(tgt.shape[0], tgt.shape[1], offset)

    def forward(self, tokens: Tensor, *, cache=None, offset: int = 0) -> Tensor:
        return self._logits(tokens.shape[0], tokens.shape[1], offset)


def every_output(kind: str, model: nn.Module, rules: Rules = Rules()) -> list[list[int]]:
    """The outputs of every decoder for a few inputs (n-best lists and samples included)."""
    gen = torch.Generator().manual_seed(0)
    if kind == "decoder":
        prompt = torch.tensor([[BOS, 5], [BOS, 6]])
        return [
            *decoding.sample(model, prompt, max_new=8, generator=gen, rules=rules),
            *decoding.sample(model, prompt, max_new=8, temperature=0, rules=rules),
            *decoding.sample(model, prompt, max_new=8, top_k=3, top_p=0.9, generator=gen, rules=rules),
        ]
    src = torch.tensor([[5, 6, EOS], [7, EOS, PAD]])
    outputs = decoding.greedy(model, src, max_len_b=8, rules=rules)
    outputs += decoding.beam_search(model, src, beam=3, max_len_b=8, rules=rules)
    for found in decoding.beam_search_nbest(model, src, beam=4, nbest=4, max_len_b=8, rules=rules):
        outputs += [h for _, h in found]
    for found in decoding.sample_translations(model, src, n=4, generator=gen, max_len_b=8, rules=rules):
        outputs += [h for _, h in found]
    return outputs


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder"])
def test_no_decoder_emits_a_special_token(kind):
    model = Prefers(kind, [PAD, BOS, MASK])
    outputs = every_output(kind, model)
    assert sum(map(len, outputs)) > len(outputs)  # something was generated, never the preferred specials
    assert not {PAD, BOS, MASK, EOS} & {t for o in outputs for t in o}
    # The control: a model with nothing banned generates them (the check can fail).
    free = Prefers(kind, [PAD, BOS, MASK], SpecialIds(start=BOS, end=EOS, pad=PAD, unk=UNK, never=()))
    assert {PAD, BOS, MASK} & {t for o in every_output(kind, free) for t in o}


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder"])
def test_unk_penalty(kind):
    model = Prefers(kind, [UNK])
    assert UNK in {t for o in every_output(kind, model) for t in o}
    assert UNK not in {t for o in every_output(kind, model, Rules(unk_penalty=100.0)) for t in o}


def test_nbest_candidates_are_distinct():
    model = Prefers("encoder_decoder", [5, 6])
    src = torch.tensor([[5, EOS]])
    found = decoding.beam_search_nbest(model, src, beam=6, nbest=6, max_len_b=5)[0]
    assert len(found) == 6 and len({tuple(h) for _, h in found}) == 6


def repeats(ids: list[int], n: int) -> bool:
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return len(grams) != len(set(grams))


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram(kind, n):
    model = Prefers(kind, [5, 6])  # two likely tokens: long outputs repeat n-grams unless told not to
    assert any(repeats(o, n) for o in every_output(kind, model))
    outputs = every_output(kind, model, Rules(no_repeat_ngram=n))
    assert not any(repeats(o, n) for o in outputs), outputs


def test_no_repeat_ngram_bans_exactly_the_completing_tokens():
    history = torch.tensor([[5, 6, 7, 5, 6, 5, 6]])  # 2-grams before the end starting with 6: (6, 7), (6, 5)
    logp = Rules(no_repeat_ngram=3).apply(torch.zeros(1, VOCAB), Prefers("decoder", []), history, torch.tensor([], dtype=torch.long), step=history.shape[1])
    # 3-grams starting (5, 6): (5, 6, 7) and (5, 6, 5): 7 and 5 are banned after "... 5 6".
    assert torch.isinf(logp[0]).nonzero().squeeze(1).tolist() == [5, 7]


def test_sources_get_their_end_token():
    model = TableModel(trap())
    src = torch.tensor([[5, 6, EOS, PAD], [5, 6, 7, PAD], [5, 6, 7, 5], [PAD, PAD, PAD, PAD]])
    assert decoding.ended_sources(model, src).tolist() == [
        [5, 6, EOS, PAD, PAD],
        [5, 6, 7, EOS, PAD],
        [5, 6, 7, 5, EOS],
        [EOS, PAD, PAD, PAD, PAD],
    ]
    ended = torch.tensor([[5, EOS], [EOS, PAD]])
    assert decoding.ended_sources(model, ended) is ended


def test_a_source_without_its_end_token_decodes_as_with_it():
    torch.manual_seed(4)
    model = tfbuilder.build_model(ModelSection.model_validate(tiny_model())).eval()
    rows = [torch.randint(5, 53, (n,)).tolist() for n in (3, 6, 1)]
    assert decoding.greedy(model, pad(rows)) == decoding.greedy(model, pad(rows, eos=True))
    assert decoding.beam_search(model, pad(rows)) == decoding.beam_search(model, pad(rows, eos=True))


def test_a_model_decodes_with_its_own_ids():
    """T5's layout: the decoder starts from the pad id 0 and ends at 1; 2 is <unk>."""
    t5 = SpecialIds.of(start=0, end=1, pad=0, unk=2)
    assert t5.never == (0,)
    table = torch.full((6, VOCAB), -5.0)
    table[:, 3] = 2.0  # our <unk> (3) is an ordinary token of this model
    table[3:, 1] = 9.0
    model = TableModel(table)
    model.specials, model.pad_id = t5, 0
    src = torch.tensor([[5, 6, 1]])
    for out in (decoding.greedy(model, src), decoding.beam_search(model, src)):
        assert out == [[3, 3, 3]]
    gpt2 = SpecialIds.of(start=7, end=7, pad=None, unk=None)
    assert gpt2.never == ()
    assert OWN.never == (PAD, BOS, MASK)
    assert SpecialIds.from_dict(t5.to_dict(), vocab_size=VOCAB) == t5
    for bad in ({**t5.to_dict(), "end": VOCAB}, {**t5.to_dict(), "never": [True]}, {"start": 0}, [0, 1]):
        with pytest.raises(ValueError, match="specials"):
            SpecialIds.from_dict(bad, vocab_size=VOCAB)
