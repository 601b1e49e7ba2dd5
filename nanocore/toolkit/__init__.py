"""The plugin toolkit: everything a backend may reuse from nanocore, public and versioned like the contract.

A plugin imports ``nanocore.hookspecs``, ``nanocore.interfaces`` and the modules below, nothing else of
``nanocore`` (the engine, layers, kernels and loader are internal and change without notice; an import-linter
contract in pyproject.toml enforces this for the in-tree plugins). Names documented here keep working across
1.x; a change that breaks them bumps ``API_VERSION``'s major.

==============================  ==================================================================================
module                          what it offers
==============================  ==================================================================================
``toolkit.numerics``            rounding references: fp8 e4m3 / int8 per row or tile, int4 groups (AutoAWQ packing,
                                zeros), fp8 scale search and GPTQ-style rounding, activation quantization
``toolkit.checkpoint``          parameters whose loaders reject a mismatching checkpoint clearly (``add_param``,
                                ``check_all_loaded``, ``CheckpointFormatError``), which tensors are quantized
                                (``quantizable_linears``, ``ignore_patterns``), the 8-bit offline ``quantize``
                                loop
``toolkit.checkpoint_formats``  a checkpoint's ``quantization_config`` (compressed-tensors, fp8, AutoAWQ, GPTQ) as
                                per-target ``QuantScheme``s + format (``parse_quantization_config``),
                                dequantization
``toolkit.checkpoint_support``  ``checkpoint_support`` bodies of the in-tree methods, compressed-tensors config
                                writers
``toolkit.int_packing``         compressed-tensors / GPTQ int32 packing of 4- and 8-bit values, group-wise int
                                rounding
``toolkit.weights``             ``ChannelScaledWeights``: per-output-channel quantized weights with merged /
                                sharded loading (qkv, gate_up, TP shards) done once; ``BlockScaledWeights``: the
                                same for one scale per 128 x 128 tile (FP8_BLOCK, DeepSeek-V3 fp8)
``toolkit.gemm``                Triton GEMMs for per-channel fp8 / int8 weights (split-K decode GEMV, tiled GEMM),
                                their torch reference, split-K helpers (``splitk_finish``); re-exports gemm_config
``toolkit.gemm_config``         launch configs: ``GemmConfig``, ``DECODE_MAX_M``, the per-shape ``default_config``
                                and ``int8_int8_config``; ``weight_only_config`` and ``SPLITK_MAX_M`` (since 1.4)
``toolkit.gemm_block``          Triton GEMM for one-byte weights with one scale per (row block, column block) tile
                                (``block_scaled_linear``), its torch reference, blockwise dequantization
``toolkit.gemv``                the M = 1 CUDA-core GEMV for one-byte weights (``GemmConfig(kind="gemv")``), the
                                int8 exponent-trick widening ``widen_byte_weights``
``toolkit.splitk``              what the weight-only GEMMs share: ``split_k_for``, ``splitk_workspace``, and the
                                ``@triton.jit`` helpers ``splitk_finish``, ``widen``, ``grouped_tile``
``toolkit.gemm_mma``            mixed-input tensor-core GEMM for per-channel int8 / fp8 weights (``launch_mma``,
                                ``GemmConfig(kind="mma")``, the weight tile as the dot's first operand), and
                                ``dequantize_channel`` (``kind="dequant"``)
``toolkit.gemm_int4``           the same for AutoAWQ-layout int4 groups (``awq_mma_linear``, ``awq_dequantize_gpu``)
                                and its unpacking helpers (``awq_weight_tile``, ``awq_int4_tile``)
``toolkit.kernel_plan``         which kernel a weight-only method runs per M (``KERNEL_PLANS``, ``kernel_for``,
                                ``switch_points``): the thresholds, stated once; methods declare ``kernel_plan``
``toolkit.cuda_library``        CUDA C++ kernels compiled by nvcc on first use into a cached shared library called
                                through ctypes (``load_cuda_library``; since 1.3)
``toolkit.act_quant``           dynamic per-token int8 / fp8 activation quantization in one Triton pass
                                (``quantize_per_token``: the numerics reference where the kernel cannot run;
                                ``quantize_per_token_triton``, ``RECIPROCAL_QMAX``; since 1.4)
``toolkit.moe_weights``         ``fp8_channel`` MoE expert weights: ``quantize_fp8_experts`` (fp8 e4m3, a float32
                                scale per output row), ``dequantize_fp8_experts``
``toolkit.kv``                  KV-cache store / gather for layouts of the core family (fused store on CUDA, torch
                                twin elsewhere), ``dequantize``, ``flat_slots``
``toolkit.prefix_cache``        block-chain helpers (``full_blocks``, ``published_prefix``, ``check_insert``), an
                                LRU of evictable blocks, the counters ``stats()`` reports
``toolkit.capability``          ``supports()`` building blocks: ``cuda_capability_reason``, ``triton_reason``;
                                ``cuda_capability``, ``sm_count`` looked up once per device, ``kernel_uses_triton``
                                (a ``kernel`` option's meaning on a device; since 1.4)
``toolkit.paths``               ``cache_dir()``: where a plugin keeps compiled kernels and tuned configs
``toolkit.timing``              CUDA-event and CUDA-graph timers for a plugin's own tuning
``toolkit.token_bitmask``       packed int32 token bitmasks in xgrammar's layout: ``pack_bitmask``, ``unpack_bitmask``,
                                ``allocate_token_bitmask``, ``apply_token_bitmask_`` (logits on any device; since 1.5)
``toolkit.vocabulary``          ``token_vocabulary(tokenizer)``: a Hugging Face tokenizer's tokens as bytes, for
                                structured-output backends (byte-level BPE, SentencePiece; since 1.5)
``toolkit.reference``           the reference backends (the oracles), to subclass or delegate to
==============================  ==================================================================================

Import the submodule you need (``from nanocore.toolkit.numerics import quantize_fp8_per_row``); this package
imports nothing itself, so importing one helper never pulls in Triton or the engine.
"""
