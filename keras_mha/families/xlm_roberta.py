"""XLM-RoBERTa (FacebookAI/xlm-roberta-*): RoBERTa's model with a multilingual
vocabulary (and XLMRobertaConfig's default for it).

Example:
    >>> FAMILY.name, FAMILY.blocks.kind, FAMILY.defaults["vocab_size"]
    ('xlm-roberta', 'encoder', 30522)
"""

from dataclasses import replace

from keras_mha.families.roberta import FAMILY as ROBERTA

FAMILY = replace(ROBERTA, name="xlm-roberta", defaults={**ROBERTA.defaults, "vocab_size": 30522})
