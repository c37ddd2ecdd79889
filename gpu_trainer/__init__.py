"""Strop's trainer: critic-free PPO on LoRA adapters and the eval gate; it only trains.

Pure PyTorch + transformers + peft; nothing here imports Django. What serving shares with the
trainer (FIM and chat formats, token credit, the show filter, samples, errors) is the torch-free
``learning_shared`` package beside this one; where a base model comes from (SmolLM2, a GGUF, the
starter model) is ``model_supply``'s.

Public entry points (import them from their modules):

- ``learning_shared.fim``: ``build_fim_prompt``, ``stop_tokens``, ``detect_family``
- ``gpu_trainer.ppo``: ``train_ppo``, ``TrainResult``
- ``learning_shared.samples``: ``load_samples``, ``Sample``
- ``gpu_trainer.adapters``: ``verify_adapter``
- ``gpu_trainer.grpo``: ``train_grpo``
- ``gpu_trainer.scoring``: ``score_dataset``
- ``learning_shared.errors``: ``TrainerInputError``, ``AdapterInvalidError``
"""
