// Writes a llama2.c-architecture model as a single ONNX decoder in the Hugging Face
// optimum / transformers.js "decoder with past" layout, using only standard ONNX
// ops (opset 17) so the onnxruntime CPU provider runs it.
//
// Inputs:  input_ids [batch_size, sequence_length] int64
//          attention_mask [batch_size, total_sequence_length] int64
//          position_ids [batch_size, sequence_length] int64
//          past_key_values.N.key|value [batch_size, n_kv_heads, past_sequence_length, head_size] float32
// Outputs: logits [batch_size, sequence_length, vocab] float32
//          present.N.key|value [batch_size, n_kv_heads, total_sequence_length, head_size] float32
//
// (Chat models are written with `kvLayout: 'slots'` instead: see OnnxWriteOptions.)
//
// Attention: key j is visible to query i iff attention_mask[b, j] == 1 and
// j <= past + i, where past = total_sequence_length - sequence_length (cache
// index, not position id), so left padding of any per-row length works.
// position_ids (supplied by the caller) only drive RoPE.
//
// Layout decisions that keep the node count low (per-op overhead dominates on
// these tiny models):
// - RoPE keeps llama2.c's interleaved-pair convention (2i, 2i+1); wq/wk are NOT
//   permuted to HF's rotate_half order. One MatMul projects q, k and v together
//   (columns ordered [slot = q heads of the group.., k, v][kv head][dim]), then
//   onnxruntime's RotaryEmbedding (interleaved) rotates the q and k columns
//   ('kernel' mode, the default), or out = y*cos + rot(y)*sin with
//   rot(y)[2i] = -y[2i+1], rot(y)[2i+1] = y[2i]
//   ('matmul' mode: rot is a tiny [head, head] signed-permutation MatMul;
//   'folded' mode: rot(q), rot(k) come from extra weight columns and the sum is
//   one ReduceSum). cos/sin come from initializer tables gathered once per run by
//   position_ids; the v slot uses cos = 1, sin = 0. Cached keys are post-RoPE
//   (as in every HF export), in llama2.c's own head-dim order.
// - 1/sqrt(head_size) is folded into the q weights.
// - Grouped-query attention without repeating K/V: q is laid out as
//   [group, batch, kv_head, seq, head] and MatMul broadcasts against the
//   [batch, kv_head, total, head] cache.
// - Each residual sum and the RMSNorm after it are one
//   SkipSimplifiedLayerNormalization (com.microsoft); the first layer's norm is
//   written as Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul, the pattern
//   onnxruntime fuses into one SimplifiedLayerNormalization kernel. w1 and w3 are
//   one matrix, split after. Transpose -> MatMul for q.k^T is fused by ORT into one FusedMatMul and
//   SiLU written as x * Sigmoid(x) into one QuickGelu(alpha = 1) kernel.
// - cos/sin tables and the additive mask are computed once per run and
//   shared by all layers.
import { GraphBuilder } from './onnx-graph.js';
import { attention, packedTokens, packingOf, sharedPrefixAttention, slotCacheAttention, type Heads } from './onnx-attention.js';
import { linear, type LinearOptions, type WeightFormat } from './onnx-linear.js';
import { headSize, kvDim, validateConfig, type LlamaCheckpoint, type LlamaConfig } from './llama2c.js';

export const OPSET = 17;
export const MASK_VALUE = -1e9;

export interface OnnxWriteOptions {
  /** name of a side file for weights (ONNX external data); default: all inline */
  externalDataFile?: string;
  /** extra metadata_props */
  metadata?: Record<string, string>;
  /** table length for RoPE; default config.seqLen */
  maxPositions?: number;
  /**
   * How the RoPE "rotate pairs" term is computed:
   * - 'folded': folded into the projection weights (fewest nodes; the qkv
   *   projection is about twice as wide), best for tiny models;
   * - 'matmul': a [head_size, head_size] signed permutation MatMul at run time
   *   (two more nodes per layer, far fewer FLOPs), best for larger models.
   * - 'kernel' (default): onnxruntime's RotaryEmbedding on q and k, projected
   *   apart from v (cloudgate-convert/7; before, one projection, split around the
   *   rotation and concatenated after): one kernel where 'matmul' ran five nodes
   *   over all three, broadcast Muls among them. 'matmul' was
   *   measured as fast as 'folded' on stories260K and ~30% faster per decode
   *   step on a 30M model; with 'kernel' the kernels of a 64-question branch
   *   step of m25 fp32 took 156 ms where they took 218 (bench/README.md "RoPE
   *   by the kernel in the past layouts").
   */
  rope?: 'folded' | 'matmul' | 'kernel';
  /**
   * The branch graph of evaluation models: every row continues one shared
   * prefix, fed once as `prefix_key_values.N.key|value` [1, n_kv_heads,
   * prefix_length, head_size] instead of copied into each row's past.
   * `past_key_values`, `attention_mask` and `present` then cover only the
   * positions after the prefix. Attention over the prefix is one MatMul of
   * all rows' queries against the prefix keys, combined with each row's own
   * attention by log-sum-exp (the two softmax halves are exact).
   */
  sharedPrefix?: boolean;
  /**
   * How the KV cache crosses the graph's boundary:
   * - 'past' (default): the Hugging Face layout above, `past_key_values` in and
   *   `present` (past and new together) out; evaluation models keep it, as their
   *   branch graph and forks build on it.
   * - 'slots': the worker's cache buffers go in as they lie and only the step's
   *   new keys and values come out (onnx-attention.ts slotCacheAttention).
   *   Inputs: input_ids, position_ids [B, S]; cache_bias [B, 1, 1, C] (0 over a
   *   row's filled positions, MASK_VALUE elsewhere); new_bias [B, 1, S, S] (the
   *   causal mask among the step's tokens, left padding hidden);
   *   cache.N.key|value [B, n_kv_heads, C, head_size]. Outputs: logits of each
   *   row's last position [B, 1, vocab]; new_key_values [2 * layers * B, n_kv_heads,
   *   S, head_size], blocks of B rows ordered (layer, key | value).
   */
  kvLayout?: 'past' | 'slots';
  /** Weight format of the matrices (onnx-linear.ts); embeddings and norms stay float32. Default f32. */
  weights?: WeightFormat;
  /** MatMulNBits accuracy_level / block size overrides, for measuring them (onnx-linear.ts) */
  accuracyLevel?: number;
  quantBlock?: number;
}

const f = Math.fround;

/**
 * RoPE angle tables computed the way llama2.c's run.c does (float32):
 * freq = 1 / powf(10000, head_dim / head_size); val = pos * freq.
 */
export function ropeCosSin(c: LlamaConfig, maxPositions: number): { cos: Float32Array; sin: Float32Array } {
  const hs = headSize(c);
  const half = hs / 2;
  const cos = new Float32Array(maxPositions * half);
  const sin = new Float32Array(maxPositions * half);
  for (let j = 0; j < half; j++) {
    const freq = f(1 / f(Math.pow(c.ropeTheta, f((2 * j) / hs))));
    for (let p = 0; p < maxPositions; p++) {
      const val = f(p * freq);
      cos[p * half + j] = Math.cos(val);
      sin[p * half + j] = Math.sin(val);
    }
  }
  return { cos, sin };
}

export function buildLlamaOnnx(ck: LlamaCheckpoint, opts: OnnxWriteOptions = {}): { model: Uint8Array; data?: Uint8Array } {
  const c = ck.config;
  const w = ck.weights;
  validateConfig(c);
  const D = c.dim;
  const H = c.nHeads;
  const KV = c.nKvHeads;
  const hd = headSize(c);
  const kd = kvDim(c);
  const g = H / KV;
  const slots = g + 2; // g query heads, 1 key head, 1 value head per kv group
  const C = slots * KV * hd; // columns of one half of the fused projection
  const hidden = c.hiddenDim;
  const V = c.vocabSize;
  const L = c.nLayers;
  const maxPos = opts.maxPositions ?? c.seqLen;
  const scale = 1 / Math.sqrt(hd);
  const lin: LinearOptions = { format: opts.weights ?? 'f32', accuracyLevel: opts.accuracyLevel, block: opts.quantBlock };

  const gb = new GraphBuilder();
  const B = 'batch_size';
  const S = 'sequence_length';
  const P = 'past_sequence_length';
  const T = 'total_sequence_length';

  const slotCache = opts.kvLayout === 'slots';
  if (slotCache && opts.sharedPrefix) throw new Error('the shared-prefix graph reads past_key_values: it has no slot-cache layout');
  const inputIds = gb.input('input_ids', 'int64', [B, S]);
  const attnMask = slotCache ? '' : gb.input('attention_mask', 'int64', [B, T]);
  const positionIds = gb.input('position_ids', 'int64', [B, S]);
  const cacheBias = slotCache ? gb.input('cache_bias', 'float32', [B, 1, 1, 'cache_capacity']) : '';
  const newBiasIn = slotCache ? gb.input('new_bias', 'float32', [B, 1, S, S]) : '';
  // One row of scores per (query head of the group, new token): the bias repeats over the group, once per run.
  const newBias = slotCache && g > 1 ? gb.op1('Tile', [newBiasIn, gb.i64([1, 1, g, 1])]) : newBiasIn;
  const pastK: string[] = [];
  const pastV: string[] = [];
  for (let l = 0; l < L; l++) {
    const [name, len] = slotCache ? [`cache.${l}`, 'cache_capacity'] : [`past_key_values.${l}`, P];
    pastK.push(gb.input(`${name}.key`, 'float32', [B, KV, len, hd]));
    pastV.push(gb.input(`${name}.value`, 'float32', [B, KV, len, hd]));
  }
  const shared = opts.sharedPrefix ?? false;
  const prefixK: string[] = [];
  const prefixV: string[] = [];
  if (shared) {
    for (let l = 0; l < L; l++) {
      prefixK.push(gb.input(`prefix_key_values.${l}.key`, 'float32', [1, KV, 'prefix_length', hd]));
      prefixV.push(gb.input(`prefix_key_values.${l}.value`, 'float32', [1, KV, 'prefix_length', hd]));
    }
  }
  // The branch graph scores only each row's next token: logits of the last position.
  // The slot-cache graph too: its worker reads no other position.
  const lastOnly = shared || slotCache;
  gb.output('logits', 'float32', [B, lastOnly ? 1 : S, V]);
  // The slot-cache graph's new keys and values: [2 * layers * B, KV, S, hd], blocks of B rows in the order
  // (layer, key | value).
  if (slotCache) gb.output('new_key_values', 'float32', ['new_rows', KV, S, hd]);
  for (let l = 0; l < (slotCache ? 0 : L); l++) {
    gb.output(`present.${l}.key`, 'float32', [B, KV, T, hd]);
    gb.output(`present.${l}.value`, 'float32', [B, KV, T, hd]);
  }

  // ---- weights ----
  gb.init('embed_tokens', [V, D], w.tokenEmbedding);

  // Every graph rotates with onnxruntime's RotaryEmbedding kernel by default: the slot-cache graph
  // in its attention block (onnx-attention.ts), the past layouts on the fused projection's q and k
  // columns. The 'matmul' rotation it replaced there (a Mul of broadcast cos / sin rows, a signed
  // permutation MatMul, another Mul and an Add, over v's columns too) took ~37 of 218 ms of a
  // 64-question branch step of m25 fp32 (bench/README.md "RoPE by the kernel in the past layouts").
  const ropeMode = slotCache ? 'kernel' : (opts.rope ?? 'kernel');
  const halves = ropeMode === 'folded' ? 2 : 1;
  // RoPE tables [maxPos, 2 (cos, sin), slots, 1, hd]; the v slot gets cos = 1, sin = 0
  const { cos, sin } = ropeCosSin(c, maxPos);
  const ropeTable = (h: number): Float32Array => {
    const t = new Float32Array(maxPos * slots * hd);
    for (let p = 0; p < maxPos; p++) {
      for (let s = 0; s < slots; s++) {
        const base = (p * slots + s) * hd;
        for (let d = 0; d < hd; d++) {
          const j = p * (hd / 2) + (d >> 1);
          t[base + d] = s === slots - 1 ? (h === 0 ? 1 : 0) : h === 0 ? cos[j]! : sin[j]!;
        }
      }
    }
    return t;
  };
  if (ropeMode === 'kernel') {
    gb.init('rope_cos_half', [maxPos, hd / 2], cos);
    gb.init('rope_sin_half', [maxPos, hd / 2], sin);
  } else if (ropeMode === 'folded') {
    const both = new Float32Array(maxPos * 2 * slots * hd);
    const tc = ropeTable(0);
    const ts = ropeTable(1);
    for (let p = 0; p < maxPos; p++) {
      both.set(tc.subarray(p * slots * hd, (p + 1) * slots * hd), (p * 2) * slots * hd);
      both.set(ts.subarray(p * slots * hd, (p + 1) * slots * hd), (p * 2 + 1) * slots * hd);
    }
    gb.init('rope_cos_sin', [maxPos, 2, slots, 1, hd], both);
  } else {
    gb.init('rope_cos', [maxPos, slots, 1, hd], ropeTable(0));
    gb.init('rope_sin', [maxPos, slots, 1, hd], ropeTable(1));
    // rot(x) = x @ R with rot(x)[2i] = -x[2i+1], rot(x)[2i+1] = x[2i]
    const R = new Float32Array(hd * hd);
    for (let m = 0; m < hd / 2; m++) {
      R[(2 * m + 1) * hd + 2 * m] = -1;
      R[2 * m * hd + 2 * m + 1] = 1;
    }
    gb.init('rope_rotate', [hd, hd], R);
  }

  // ---- shared per-run values: additive attention bias [B, 1, S, T] and RoPE rows ----
  const bias = slotCache ? '' : attentionBias(gb, inputIds, attnMask);
  // The slot-cache graph splits each softmax row into [capacity, S] (cache, then new tokens).
  const probSplit = slotCache
    ? gb.op1('Concat', [gb.op1('Shape', [pastK[0]!], { start: 2, end: 3 }), gb.op1('Shape', [inputIds], { start: 1, end: 2 })], { axis: 0 })
    : '';
  const newKv: string[] = [];
  const s1 = shared ? gb.op1('Shape', [inputIds], { start: 1, end: 2 }) : '';
  const t1 = shared ? gb.op1('Shape', [attnMask], { start: 1, end: 2 }) : '';
  const p1 = shared ? gb.op1('Sub', [t1, s1]) : '';
  // shared-prefix graph: the bias over own positions, the prefix length, and zero values over own columns
  const ownBias = shared ? gb.op1('Squeeze', [bias, gb.i64([1])]) : ''; // [B, S, T]
  const packing = shared ? packingOf(gb, attnMask, p1, t1, { KV, g, hd }) : undefined;
  const prefixLen = shared ? gb.op1('Shape', [prefixK[0]!], { start: 2, end: 3 }) : '';
  // The rows are expanded over the KV heads once per run: a Mul that broadcasts
  // a middle axis runs in 8-float pieces, about ten times slower than one
  // over equal shapes, and every layer does two.
  const bs = ropeMode === 'kernel' ? '' : gb.op1('Shape', [inputIds]);
  const ropeRows =
    ropeMode === 'folded'
      ? gb.op1('Expand', [gb.op1('Gather', ['rope_cos_sin', positionIds], { axis: 0 }), gb.op1('Concat', [bs, gb.i64([2, slots, KV, hd])], { axis: 0 })], {}, 'rope_rows')
      : ''; // [B, S, 2, slots, KV, hd]
  const perHead = ropeMode === 'matmul' ? gb.op1('Concat', [bs, gb.i64([slots, KV, hd])], { axis: 0 }) : '';
  const cosRows = ropeMode === 'matmul' ? gb.op1('Expand', [gb.op1('Gather', ['rope_cos', positionIds], { axis: 0 }), perHead], {}, 'rope_cos_rows') : ''; // [B, S, slots, KV, hd]
  const sinRows = ropeMode === 'matmul' ? gb.op1('Expand', [gb.op1('Gather', ['rope_sin', positionIds], { axis: 0 }), perHead], {}, 'rope_sin_rows') : '';

  // The branch graph runs its per-token work (norms, projections, RoPE, feed-forward) on the
  // step's real tokens only, packed: its rows are questions of unequal lengths,
  // left-padded to the longest, and 64 questions of 10-13 tokens are 832 slots for 704 tokens, so a
  // step that is nearly all matrix products did 18 % more of them (bench/README.md "Branch steps
  // on real tokens"). Only attention reads the rows as [B, S] (onnx-attention.ts); the rest sees
  // [N, 1, D].
  const packed = shared && ropeMode === 'kernel' ? packedTokens(gb, packing!, inputIds, positionIds) : undefined;
  let x = gb.op1('Gather', ['embed_tokens', packed?.ids ?? inputIds], { axis: 0 }, 'embeddings');
  const ropePositions = packed?.positions ?? positionIds;
  // Each layer's input norm; after the first, the previous layer's residual sum computes it.
  let xn = '';

  const pow2 = gb.f32(2);
  const eps = gb.f32(c.normEps);
  const rmsNorm = (inp: string, weight: string, tag: string): string => {
    const sq = gb.op1('Pow', [inp, pow2]);
    const ms = gb.op1('ReduceMean', [sq], { axes: [-1], keepdims: 1 });
    const ad = gb.op1('Add', [ms, eps]);
    const rt = gb.op1('Sqrt', [ad]);
    const dv = gb.op1('Div', [inp, rt]);
    return gb.op1('Mul', [dv, weight], {}, `${tag}_out`);
  };

  /**
   * `x + skip` and its RMSNorm, one onnxruntime SkipSimplifiedLayerNormalization kernel where an
   * Add and a norm were two nodes; returns [normed, sum] (sum '' when not wanted).
   */
  const skipNorm = (inp: string, skip: string, weight: string, sumName: string, wantSum = true): [string, string] => {
    const [normed, , , sum] = gb.op(
      'SkipSimplifiedLayerNormalization',
      [inp, skip, weight],
      { epsilon: { float: c.normEps } },
      [gb.fresh('skip_norm'), '', '', wantSum ? sumName : ''],
      undefined,
      'com.microsoft',
    );
    return [normed!, sum!];
  };

  const shapeHeads = slotCache ? '' : ropeMode === 'folded' ? gb.i64([0, 0, 2, slots, KV, hd]) : gb.i64([0, 0, slots, KV, hd]);
  // The kernel's rotation: q and k heads ([B, S, (g + 1) * KV * hd], each head's dims together), v projected apart.
  const shapeQkHeads = !slotCache && ropeMode === 'kernel' ? gb.i64([0, 0, g + 1, KV, hd]) : '';
  const shapeVHeads = !slotCache && ropeMode === 'kernel' ? gb.i64([0, 0, KV, hd]) : '';
  const shapeBSD = gb.i64([0, 0, -1]);

  for (let l = 0; l < L; l++) {
    // fused projection weight [D, halves*C], columns (half, slot, kv, d); the slot-cache
    // graph's are plain [q heads | k heads | v heads] (onnx-attention.ts slotCacheAttention)
    const W = halves * C;
    const wqkv = new Float32Array(D * W);
    const wqL = w.wq.subarray(l * D * D, (l + 1) * D * D);
    const wkL = w.wk.subarray(l * kd * D, (l + 1) * kd * D);
    const wvL = w.wv.subarray(l * kd * D, (l + 1) * kd * D);
    for (let half = 0; half < halves; half++) {
      for (let s = 0; s < slots; s++) {
        for (let k = 0; k < KV; k++) {
          for (let d = 0; d < hd; d++) {
            const col = slotCache ? (s < g ? k * g + s : H + (s - g) * KV + k) * hd + d : ((half * slots + s) * KV + k) * hd + d;
            let src: Float32Array | null;
            let row: number;
            let mul: number;
            if (s < g) {
              src = wqL;
              row = (k * g + s) * hd;
              mul = scale;
            } else if (s === g) {
              src = wkL;
              row = k * hd;
              mul = 1;
            } else {
              src = half === 0 ? wvL : null;
              row = k * hd;
              mul = 1;
            }
            if (!src) continue;
            if (half === 0) row += d;
            else if (d % 2 === 0) {
              row += d + 1;
              mul = -mul;
            } else row += d - 1;
            for (let i = 0; i < D; i++) wqkv[i * W + col] = src[row * D + i]! * mul;
          }
        }
      }
    }
    gb.init(`layers.${l}.attn_norm.weight`, [D], w.rmsAtt.slice(l * D, (l + 1) * D));
    if (l === 0) xn = rmsNorm(x, 'layers.0.attn_norm.weight', 'layers.0.attn_norm');
    // o projection: rows ordered as the attention's context: (slot, kv, d), or plain heads in the slot-cache graph
    const woT = new Float32Array(D * D);
    const woL = w.wo.subarray(l * D * D, (l + 1) * D * D);
    for (let s = 0; s < g; s++) {
      for (let k = 0; k < KV; k++) {
        for (let d = 0; d < hd; d++) {
          const r = slotCache ? (k * g + s) * hd + d : (s * KV + k) * hd + d;
          const srcCol = (k * g + s) * hd + d;
          for (let o = 0; o < D; o++) woT[r * D + o] = woL[o * D + srcCol]!;
        }
      }
    }
    gb.init(`layers.${l}.ffn_norm.weight`, [D], w.rmsFfn.slice(l * D, (l + 1) * D));

    // ---- attention ----
    // The past layouts' kernel RoPE projects q and k apart from v: the rotation reads q and k only,
    // and v goes to the attention as it comes, with no Split and Concat around the rotation.
    const qkColumns = (g + 1) * KV * hd;
    const vApart = !slotCache && ropeMode === 'kernel';
    const proj = vApart
      ? linear(gb, xn, `layers.${l}.attn.qk.weight`, columns(wqkv, D, W, 0, qkColumns), D, qkColumns, lin) // [B, S, (g + 1) * KV * hd]
      : linear(gb, xn, `layers.${l}.attn.qkv.weight`, wqkv, D, W, lin); // [B, S, halves*C]
    // The past layouts rotate q and k here (RoPE as above); the slot-cache graph in its attention block.
    const rotate = (): Heads => {
      if (vApart) {
        const v = linear(gb, xn, `layers.${l}.attn.v.weight`, columns(wqkv, D, W, qkColumns, W), D, W - qkColumns, lin);
        const qkRotated = gb.msOp1('RotaryEmbedding', [proj, ropePositions, 'rope_cos_half', 'rope_sin_half'], { interleaved: 1 });
        const slots = (t: string, width: number) => (packed ? packed.unpack(t, width) : t); // [B, S, width]
        return { rotated: gb.op1('Reshape', [slots(qkRotated, qkColumns), shapeQkHeads]), v: gb.op1('Reshape', [slots(v, W - qkColumns), shapeVHeads]) }; // [B, S, g + 1, KV, hd], [B, S, KV, hd]
      }
      const projHeads = gb.op1('Reshape', [proj, shapeHeads]); // [B, S, (2,) slots, KV, hd]
      if (ropeMode === 'folded') {
        // [B, S, 2, slots, KV, hd] * [B, S, 2, slots, 1, hd], summed over the (cos, sin) axis
        return { rotated: gb.op1('ReduceSum', [gb.op1('Mul', [projHeads, ropeRows]), gb.i64([2])], { keepdims: 0 }) };
      }
      const swapped = gb.op1('MatMul', [projHeads, 'rope_rotate']);
      return { rotated: gb.op1('Add', [gb.op1('Mul', [projHeads, cosRows]), gb.op1('Mul', [swapped, sinRows])]) }; // [B, S, slots, KV, hd]
    };
    let ctxT: string;
    if (slotCache) {
      const att = slotCacheAttention(gb, proj, pastK[l]!, pastV[l]!, { g, KV, hd, cacheBias, newBias, positionIds, probSplit });
      newKv.push(att.k, att.v);
      ctxT = att.ctx;
    } else if (shared) {
      ctxT = sharedPrefixAttention(gb, rotate(), pastK[l]!, pastV[l]!, { k: prefixK[l]!, v: prefixV[l]!, len: prefixLen }, packing!, l, { g, hd, bias: ownBias, lastOnly: l === L - 1 });
    } else ctxT = attention(gb, rotate(), pastK[l]!, pastV[l]!, l, { g, bias });
    let ctxFlat = gb.op1('Reshape', [ctxT, shapeBSD]); // [B, S, D]
    if (packed && l < L - 1) ctxFlat = packed.pack(ctxFlat, D); // [N, 1, D]
    // The last layer goes on with each row's last position only (it alone is read) in the branch graph and the slot-cache graph.
    const lastPosition = (t: string) => gb.op1('Slice', [t, gb.i64([-1]), gb.i64([2 ** 62]), gb.i64([1])]); // [B, 1, D]
    if (slotCache && l === L - 1) ctxFlat = lastPosition(ctxFlat);
    const attnOut = linear(gb, ctxFlat, `layers.${l}.attn.o.weight`, woT, D, D, lin);
    if (lastOnly && l === L - 1) x = packed ? packed.lastOfRows(x, D) : lastPosition(x);
    let xf: string;
    [xf, x] = skipNorm(x, attnOut, `layers.${l}.ffn_norm.weight`, `layers.${l}.attn_residual`);

    // ---- SwiGLU feed-forward: w1 and w3 as one matrix (one kernel call), split after ----
    // [D, 2 * hidden]: row i holds input i's weights, w1's columns then w3's (both stored [hidden, D]).
    const w13 = new Float32Array(D * 2 * hidden);
    for (let j = 0; j < hidden; j++) {
      for (let i = 0; i < D; i++) {
        w13[i * 2 * hidden + j] = w.w1[(l * hidden + j) * D + i]!;
        w13[i * 2 * hidden + hidden + j] = w.w3[(l * hidden + j) * D + i]!;
      }
    }
    const gateUp = linear(gb, xf, `layers.${l}.ffn.w13.weight`, w13, D, 2 * hidden, lin);
    const [a, b] = gb.op('Split', [gateUp, gb.i64([hidden, hidden])], { axis: -1 }, 2) as [string, string];
    const silu = gb.op1('Mul', [a, gb.op1('Sigmoid', [a])]);
    const gated = gb.op1('Mul', [silu, b]);
    const down = linear(gb, gated, `layers.${l}.ffn.w2.weight`, transpose(w.w2.subarray(l * D * hidden, (l + 1) * D * hidden), D, hidden), hidden, D, lin);
    // The residual sum and the next norm (the next layer's, or the final one) in one kernel.
    [xn, x] = skipNorm(x, down, l < L - 1 ? `layers.${l + 1}.attn_norm.weight` : 'norm.weight', `layers.${l}.ffn_residual`, l < L - 1);
  }

  gb.init('norm.weight', [D], w.rmsFinal.slice());
  linear(gb, xn, 'lm_head.weight', transpose(w.wcls, V, D), D, V, lin, 'logits');
  // The slot-cache graph's new keys and values leave as one tensor: every output costs onnxruntime-node a
  // conversion (about 3 us each, bench/README.md), and a step has two a layer.
  if (slotCache) gb.op1('Concat', newKv, { axis: 0 }, 'new_key_values');

  return gb.encode({
    graphName: 'cloudgate_llama',
    opset: OPSET,
    producer: 'cloudgate-convert',
    docString: `llama2.c architecture; RoPE on interleaved pairs (${ropeMode})`,
    metadata: {
      model_type: 'llama',
      num_hidden_layers: String(L),
      num_attention_heads: String(H),
      num_key_value_heads: String(KV),
      head_dim: String(hd),
      hidden_size: String(D),
      cloudgate_rope: `interleaved-${ropeMode}`,
      cloudgate_weights: lin.format,
      vocab_size: String(V),
      max_position_embeddings: String(maxPos),
      ...opts.metadata,
    },
    externalDataFile: opts.externalDataFile,
  });
}

/**
 * The past layout's additive attention bias [B, 1, S, T]: key j is visible to
 * query i iff attention_mask[b, j] == 1 and j <= past + i.
 */
function attentionBias(gb: GraphBuilder, inputIds: string, attnMask: string): string {
  const s1 = gb.op1('Shape', [inputIds], { start: 1, end: 2 });
  const t1 = gb.op1('Shape', [attnMask], { start: 1, end: 2 });
  const axis0 = gb.i64([0]);
  const tSc = gb.op1('Squeeze', [t1, axis0]);
  const pSc = gb.op1('Squeeze', [gb.op1('Sub', [t1, s1]), axis0]);
  const one = gb.i64(1);
  const keyIdx = gb.op1('Range', [gb.i64(0), tSc, one]); // [T]
  const qIdx = gb.op1('Range', [pSc, tSc, one]); // [S], cache index of each query
  const causal = gb.op1('LessOrEqual', [keyIdx, gb.op1('Unsqueeze', [qIdx, gb.i64([1])])]); // [S, T]
  const mask4 = gb.op1('Unsqueeze', [gb.op1('Cast', [attnMask], { to: 9 /* BOOL */ }), gb.i64([1, 2])]); // [B, 1, 1, T]
  const visible = gb.op1('And', [causal, mask4]); // [B, 1, S, T]
  return gb.op1('Where', [visible, gb.f32(0), gb.f32(MASK_VALUE)], {}, 'attention_bias');
}

/** Columns [from, to) of a [rows, cols] row-major matrix, as a [rows, to - from] one. */
function columns(m: Float32Array, rows: number, cols: number, from: number, to: number): Float32Array {
  const out = new Float32Array(rows * (to - from));
  for (let r = 0; r < rows; r++) out.set(m.subarray(r * cols + from, r * cols + to), r * (to - from));
  return out;
}

/** [rows, cols] row-major -> [cols, rows] */
export function transpose(m: Float32Array, rows: number, cols: number): Float32Array {
  if (m.length !== rows * cols) throw new Error(`transpose: ${m.length} != ${rows}x${cols}`);
  const out = new Float32Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    const base = r * cols;
    for (let c2 = 0; c2 < cols; c2++) out[c2 * rows + r] = m[base + c2]!;
  }
  return out;
}
