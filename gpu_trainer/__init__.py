"""Strop's trainer: critic-free PPO on LoRA adapters, the starter model, FIM formats.

Pure PyTorch + transformers + peft; nothing here imports Django. This package module imports
nothing heavy on purpose: serving imports ``gpu_trainer.fim`` and must not pay for torch.

Public entry points (import them from their modules):

- ``gpu_trainer.fim``: ``build_fim_prompt``, ``stop_tokens``, ``detect_family``
- ``gpu_trainer.starter``: ``ensure_starter_model``
- ``gpu_trainer.ppo``: ``train_ppo``, ``TrainResult``
- ``gpu_trainer.samples``: ``load_samples``, ``Sample``
- ``gpu_trainer.adapters``: ``verify_adapter``
- ``gpu_trainer.grpo``: ``train_grpo``
- ``gpu_trainer.scoring``: ``score_dataset``
- ``gpu_trainer.errors``: ``TrainerInputError``, ``AdapterInvalidError``
"""
