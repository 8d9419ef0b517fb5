"""Benchmarks of t5x_lite: `python -m bench NAME [--quick] [options]` from the repository root.

  matmul_peak    measured peak FLOP/s (jitted fp32/bf16 matmuls), the MFU denominator
  compile_time   train-step compile time, scan_layers True vs False, by layer count
  remat_memory   compiled train-step memory (memory_analysis) for every remat policy
  throughput     train tokens/s and MFU of the LLaMA, GPT-2 and T5 families, fp32 and bf16
  loop_overhead  training.loop.train and Trainer.train_step tokens/s vs. a bare jitted step of the same model
  input_pipeline input pipeline tokens/s vs. train-step consumption; epoch counting; iterator restore
  prepare_formats  prepare MB/s of the same text as .jsonl, .jsonl.gz, .jsonl.zst and .parquet
  checkpoint     checkpoint save/restore GB/s vs. the disk's dd speed; async save blocked time
  storage        checkpoint save/restore and by-index reads on gs:// (a local GCS emulator) vs. local disk
  decoding       generation tokens/s, KV cache vs. recompute; T5 beam search
  evaluation     eval throughput: strided perplexity tokens/s, multiple-choice examples/s
  gpu_decoders   bf16 tokens/s and MFU of gin/models/decoder_*.gin on a GPU (first remat that fits)
  step_profile   where a train step's device time goes, by kind of op, from a jax.profiler trace
  torch_reference  eager PyTorch nanoGPT-style decoder tokens/s at throughput's sizes
  matmul_shapes  the train step's dense matmuls, each alone, in JAX and in PyTorch: the kernels' share of a gap
  large_models   compile-only 1.3B decoder and T5-XL on 8 host devices: memory vs estimate, collectives
  all            matmul_peak to evaluation, torch_reference and matmul_shapes, in sequence (CPU_BENCHMARKS)

Each prints a header line (date, CPU, cores, accelerator, versions, the exact command), a
markdown table, and the settings it ran with. `--quick` uses tiny sizes, to check the scripts.
"""
