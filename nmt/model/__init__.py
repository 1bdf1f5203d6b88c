"""The model: attention plug-ins, the GRU encoder-decoder, its loss, search, ensembles and the checkpoint format."""
