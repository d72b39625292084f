"""Hugging Face interchange: GPT-2, BERT, T5 and the Llama-like decoders (Llama 3.1, Mistral, Qwen2, Qwen3,
Phi-3, Gemma 2, Gemma 3, OLMo 2, Mixtral, Qwen3-MoE, DeepSeek-V3, Qwen2-MoE) as tfbuilder recipes, exactly.

``configs`` maps a ``config.json`` onto a recipe's model section and back, ``weights`` maps state
dicts, ``convert`` reads and writes model directories and run directories. No Lightning here; the
``transformers`` package is not needed (only ``safetensors``).
"""

from tfbuilder.interop.hf.configs import FAMILIES, UnsupportedConfig, family_of, from_config, to_config
from tfbuilder.interop.hf.convert import export, import_hf

__all__ = ["FAMILIES", "UnsupportedConfig", "family_of", "from_config", "to_config", "export", "import_hf"]
