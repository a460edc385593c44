"""A streamed user dataset: TFRecords of its own schema read by an input function, and a two-input model."""
