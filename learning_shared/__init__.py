"""What the API and the trainer share, free of torch: the formats a policy is served and trained in.

The API process imports these on every request, so nothing here imports torch, transformers,
peft, Django or the trainer (a contract in pyproject.toml checks it):

- ``learning_shared.fim``: FIM prompt formats (``build_fim_prompt``, ``stop_tokens``, ``detect_family``)
- ``learning_shared.fim_metrics``: first-line match, exact match and edit similarity
- ``learning_shared.offline_eval``: a candidate's figures on the eval set and their reader; ``intervals``: 95 % ones
- ``learning_shared.chat`` and ``chat_template.jinja``: the chat prompt both serving and training build
- ``learning_shared.credit``: token-level credit of a partial accept, an edit, a persisted edit
- ``learning_shared.show_filter``: the show threshold, fitted by the trainer and applied by serving
- ``learning_shared.samples``: ``Sample``, the unit the exporter hands the trainer, and ``load_samples``
- ``learning_shared.errors``: ``TrainerInputError``, ``AdapterInvalidError`` and the trainer's other errors
"""
