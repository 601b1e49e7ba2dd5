"""logit_bias and structured-output bitmasks in the sampler, through the runner's SamplingInputs, and in the plan."""
from __future__ import annotations

import pickle

import pytest
import torch

from nanocore.engine.sampling_params import SamplingParams
from nanocore.engine.sequence import row_sampling
from nanocore.layers.sampler import Sampler
from nanocore.runner.sampling_inputs import SamplingInputs
from nanocore.runner.step_plan import ScheduledRow, StepPlan, decode_plan, encode_plan
from nanocore.toolkit.token_bitmask import pack_bitmask

VOCAB = 70  # not a multiple of 32: the last mask word is partly padding

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def row(seq_id: int, params: SamplingParams) -> ScheduledRow:
    return ScheduledRow(seq_id, 0, [1, 2], [0], True, 0, row_sampling(params, eos_token_ids=[2]))


def allowed_rows(*token_sets) -> torch.Tensor:
    allowed = torch.zeros(len(token_sets), VOCAB, dtype=torch.bool)
    for i, tokens in enumerate(token_sets):
        allowed[i, list(tokens)] = True
    return pack_bitmask(allowed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_masks_reach_their_rows_and_no_bias_lifts_a_masked_token(device, temperature):
    device = torch.device(device)
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0)).to(device) * 3
    rows = [row(10, SamplingParams(temperature=temperature, seed=1)),
            row(11, SamplingParams(temperature=temperature, seed=2, logit_bias={5: 100.0})),  # masked below
            row(12, SamplingParams(temperature=temperature, seed=3)),
            row(13, SamplingParams(temperature=temperature, seed=4, logit_bias={69: 100.0}))]
    bitmask = allowed_rows({3, 4}, {7}, {64, 69})  # sampling rows 0, 1 and 3 are constrained
    inputs = SamplingInputs(device)
    sampler = Sampler(torch.Generator(device=device).manual_seed(0))
    for _ in range(20):
        ids = sampler(logits, inputs.tensors(rows, bitmask, [0, 1, 3])).token_ids.tolist()
        assert ids[0] in (3, 4) and ids[1] == 7 and ids[3] == 69
    unmasked = sampler(logits, inputs.tensors(rows)).token_ids.tolist()
    assert unmasked[1] == 5 and unmasked[3] == 69  # +100 forces a token the mask allows
    with pytest.raises(ValueError, match="malformed step plan: 3 token bitmask rows"):
        inputs.tensors(rows, bitmask, [0, 1])


@pytest.mark.parametrize("device", DEVICES)
def test_negative_bias_forbids_and_logprobs_see_the_edits(device):
    device = torch.device(device)
    logits = torch.zeros(2, VOCAB, device=device)
    logits[:, 9] = 5.0  # the greedy choice of both rows
    rows = [row(1, SamplingParams(temperature=0, logprobs=2, logit_bias={9: -100.0})),
            row(2, SamplingParams(temperature=0, logprobs=2))]
    out = Sampler()(logits, SamplingInputs(device).tensors(rows, allowed_rows({9, 30}), [1]))
    assert out.token_ids.tolist()[1] == 9 and out.token_ids.tolist()[0] != 9
    lps, ids = out.logprobs.cpu(), out.logprob_token_ids.cpu()
    assert ids[1].tolist() == [9, 9, 30]  # row 1's mask leaves two tokens: its logprobs are theirs alone
    masked = torch.log_softmax(torch.tensor([5.0, 0.0]), 0)
    torch.testing.assert_close(lps[1], masked[[0, 0, 1]])
    torch.testing.assert_close(lps[0, 0], -torch.log(torch.tensor(VOCAB - 1.0)))  # token 9 biased out of row 0


def test_plan_carries_the_bias_to_other_ranks_and_the_mask_stays_on_rank_0():
    plan = StepPlan([row(4, SamplingParams(logit_bias={8: -3.5, 2: 1.0})), row(5, SamplingParams())])
    plan.token_bitmask, plan.bitmask_rows = allowed_rows({1}), [1]
    decoded = decode_plan(pickle.loads(pickle.dumps(encode_plan(plan))))
    assert decoded == plan and decoded.token_bitmask is None
    assert decoded.rows[0].sampling.logit_bias == ((2, 1.0), (8, -3.5)) and decoded.rows[1].sampling.logit_bias == ()
