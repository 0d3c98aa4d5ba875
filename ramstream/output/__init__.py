"""The Hugging Face model directory a merge produces: its work area and finalisation
(``directory``), shard names and headers (``shards``), ``config.json`` (``hf_config``) and the
model card (``model_card``)."""
