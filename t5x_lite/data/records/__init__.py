"""Records: a prepared directory's files, read and checked.

Owns:
  prepared_dataset.py  a prepared directory's layout (file names, the tokenizer copy) and its
                       metadata.json, written and read back (`read_metadata`, `split_entry`)
  record_index.py      a prepared split's offset index: written, checked, records read by number
  tfrecord_stream.py   TFRecord shards streamed through storage (CRC-checked), for s3://
  record_frame.py      one TFRecord frame read and checked (length, CRCs): what is wrong, if anything;
                       one frame written
  example_codec.py     tf.train.Example records encoded and their int64 features decoded, without
                       TensorFlow

May import: storage, errors, tf_setup (the bottom layer of data/).
"""
