"""Megatron-LM legacy checkpoints: ``iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt`` merged into one model."""
