"""Logits at a few positions, unembedded alone, are the full logits there in every family.

:func:`~structlens.interventions.fastrun.metric_logits` unembeds the gathered final hidden
states itself, so whatever a family's head does after the unembedding (Gemma-2/3's
soft-capping, Granite's logit scaling, Cohere's logit scale) must be done there too; a family
whose head it misses shows up here as logits that differ from the model's own.
"""

import pytest
import torch

from structlens.interventions.fastrun import metric_logits
from structlens.models import load_model
from structlens.models.tiny import TINY_NAMES

POSITIONS = [[2, 6], [1, 3]]


@pytest.mark.parametrize("name", TINY_NAMES)
def test_metric_logits_are_the_full_logits_at_the_positions(name):
    model = load_model(name, seed=0)
    if not model.causal or model.is_encoder_decoder:
        pytest.skip(f"{name} has no next-token logits of its own")
    ids = torch.randint(3, 200, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        full = model.forward(ids, mask)
        part = metric_logits(model, ids, mask, POSITIONS)
    want = torch.stack([full[i, p] for i, p in enumerate(POSITIONS)])
    torch.testing.assert_close(part, want, rtol=1e-5, atol=1e-5)
