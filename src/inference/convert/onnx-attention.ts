// The attention blocks of the converted decoder (see onnx-writer.ts): the
// model graph's, where every row attends over its own cache, and the branch
// graph's, where all rows continue one shared prefix.
import type { GraphBuilder } from './onnx-graph.js';

/** How far below its row's max a score may sit before softmax (see softmaxNoDenormals). */
export const SOFTMAX_FLOOR = 60;

/**
 * Softmax over the last axis with every score first raised to at least its
 * row's max minus SOFTMAX_FLOOR. Masked (-1e9) and far-below-max scores
 * otherwise come out of exp() as denormal floats, which x86 CPUs compute
 * dozens of times slower than normal ones, in the Softmax and again in the
 * MatMul that reads the probabilities: it tripled the time of a 370-token
 * prefill. onnxruntime's flush-to-zero switch cannot help: it reaches only
 * the thread that created the process's first session. A weight of
 * e^-SOFTMAX_FLOOR (1e-26) in place of 0 is far below float32's precision.
 */
export function softmaxNoDenormals(gb: GraphBuilder, scores: string): string {
  const floor = gb.op1('Sub', [gb.op1('ReduceMax', [scores], { axes: [-1], keepdims: 1 }), gb.f32(SOFTMAX_FLOOR)]);
  return gb.op1('Softmax', [gb.op1('Max', [scores, floor])], { axis: -1 });
}

/**
 * The past layouts' projections: `rotated` [B, S, slots, KV, hd] holds q's g slots and k's,
 * and v's too unless `v` [B, S, KV, hd] comes on its own (the kernel RoPE's graph projects v
 * apart, so no Split and Concat move it around the rotation of q and k).
 */
export interface Heads {
  rotated: string;
  v?: string;
}

/** v as [B, KV, S, hd], from its own projection or from `heads` (slots on `slotAxis`), then transposed by `perm`. */
function valuesOf(gb: GraphBuilder, h: Heads, heads: string, slot: number, slotAxis: number, perm: number[]): string {
  if (h.v) return gb.op1('Transpose', [h.v], { perm: [0, 2, 1, 3] });
  const v = gb.op1('Gather', [heads, gb.i64(slot)], { axis: slotAxis });
  return perm.every((p, i) => p === i) ? v : gb.op1('Transpose', [v], { perm });
}

/** Attention of every row over its own cache; returns the context as [B, S, g, KV, hd]. */
export function attention(gb: GraphBuilder, h: Heads, pastK: string, pastV: string, l: number, c: { g: number; bias: string }): string {
  const heads = gb.op1('Transpose', [h.rotated], { perm: [2, 0, 3, 1, 4] }); // [slots, B, KV, S, hd]
  const q = gb.op1('Slice', [heads, gb.i64([0]), gb.i64([c.g]), gb.i64([0])]); // [g, B, KV, S, hd]
  const k = gb.op1('Gather', [heads, gb.i64(c.g)], { axis: 0 }); // [B, KV, S, hd]
  const v = valuesOf(gb, h, heads, c.g + 1, 0, [0, 1, 2, 3]);
  const presentK = gb.op1('Concat', [pastK, k], { axis: 2 }, `present.${l}.key`);
  const presentV = gb.op1('Concat', [pastV, v], { axis: 2 }, `present.${l}.value`);
  const kT = gb.op1('Transpose', [presentK], { perm: [0, 1, 3, 2] }); // [B, KV, hd, T]
  const scores = gb.op1('MatMul', [q, kT]); // [g, B, KV, S, T]
  const probs = softmaxNoDenormals(gb, gb.op1('Add', [scores, c.bias]));
  const ctx = gb.op1('MatMul', [probs, presentV]); // [g, B, KV, S, hd]
  return gb.op1('Transpose', [ctx], { perm: [1, 3, 0, 2, 4] });
}

/**
 * Where the real (unpadded) new tokens sit among the B x S query slots, so
 * that attention over the prefix, the costly part, runs on real tokens only:
 * `index` [N] lists their slots, `slot` [B*S] maps each slot back to its place
 * in the packed list (pads to N, a row of zeros appended for them).
 */
export interface Packing {
  index: string;
  slot: string;
  /** Shapes [0, 0, -1, T] and [0, -1, T]: a [KV, g, B, S, T] tensor as slots, and packed rows as one list. */
  slotsT: string;
  rowsT: string;
  /** [0, g, -1, T] and [0, g, -1, hd]: a packed list back to [KV, g, N, *]. */
  perHeadT: string;
  perHeadHd: string;
  /** Zero rows [KV, g, 1, T] and [KV, g, 1, hd] that pads gather. */
  zeroT: string;
  zeroHd: string;
  /** Zero values [KV, T, hd] under the own columns of the prefix MatMul. */
  zeroPv: string;
}

export function packingOf(gb: GraphBuilder, attnMask: string, past: string, total: string, c: { KV: number; g: number; hd: number }): Packing {
  const isNew = gb.op1('Reshape', [gb.op1('Slice', [attnMask, past, total, gb.i64([1])]), gb.i64([-1])]); // [B*S], 1 for real tokens
  const index = gb.op1('Squeeze', [gb.op1('NonZero', [gb.op1('Cast', [isNew], { to: 9 /* BOOL */ })]), gb.i64([0])]);
  const place = gb.op1('Sub', [gb.op1('CumSum', [isNew, gb.i64(0)]), gb.i64(1)]);
  const slot = gb.op1('Where', [gb.op1('Cast', [isNew], { to: 9 }), place, gb.op1('Shape', [index])]);
  const zeros = (tail: string) => gb.op1('ConstantOfShape', [gb.op1('Concat', [gb.i64([c.KV, c.g, 1]), tail], { axis: 0 })]);
  return {
    index,
    slot,
    slotsT: gb.op1('Concat', [gb.i64([0, 0, -1]), total], { axis: 0 }),
    rowsT: gb.op1('Concat', [gb.i64([0, -1]), total], { axis: 0 }),
    perHeadT: gb.op1('Concat', [gb.i64([0, c.g, -1]), total], { axis: 0 }),
    perHeadHd: gb.i64([0, c.g, -1, c.hd]),
    zeroT: zeros(total),
    zeroHd: zeros(gb.i64([c.hd])),
    zeroPv: gb.op1('ConstantOfShape', [gb.op1('Concat', [gb.i64([c.KV]), total, gb.i64([c.hd])], { axis: 0 })]),
  };
}

/** The branch graph's real tokens packed as [N, 1, *], and the moves between them and the rows [B, S, *]. */
export interface PackedTokens {
  ids: string;
  positions: string;
  /** [N, 1, width] -> [B, S, width], zeros in the pads. */
  unpack: (t: string, width: number) => string;
  /** [B, S, width] -> [N, 1, width]. */
  pack: (t: string, width: number) => string;
  /** [N, 1, width] -> each row's last token [B, 1, width] (rows are left-padded: a row's last slot is a token). */
  lastOfRows: (t: string, width: number) => string;
}

export function packedTokens(gb: GraphBuilder, pk: Packing, inputIds: string, positionIds: string): PackedTokens {
  // [N, 1]: the packed tokens as N rows of one token, not one row of N: onnxruntime's RotaryEmbedding
  // refuses a row longer than its tables (max positions), which 64 questions' tokens can be.
  const index = gb.op1('Unsqueeze', [pk.index, gb.i64([1])]);
  const ofSlots = (t: string) => gb.op1('Gather', [gb.op1('Reshape', [t, gb.i64([-1])]), index], { axis: 0 });
  const shapeBS = gb.op1('Shape', [inputIds]);
  const lastSlots = gb.op1('Slice', [gb.op1('Reshape', [pk.slot, shapeBS]), gb.i64([-1]), gb.i64([2 ** 62]), gb.i64([1])]); // [B, 1]
  const flat = (t: string, width: number) => gb.op1('Reshape', [t, gb.i64([-1, width])]);
  return {
    ids: ofSlots(inputIds),
    positions: ofSlots(positionIds),
    unpack: (t, width) => {
      const withZero = gb.op1('Concat', [flat(t, width), gb.op1('ConstantOfShape', [gb.i64([1, width])])], { axis: 0 }); // [N + 1, width]
      return gb.op1('Reshape', [gb.op1('Gather', [withZero, pk.slot], { axis: 0 }), gb.op1('Concat', [shapeBS, gb.i64([width])], { axis: 0 })]);
    },
    pack: (t, width) => gb.op1('Gather', [flat(t, width), index], { axis: 0 }),
    lastOfRows: (t, width) => gb.op1('Gather', [flat(t, width), lastSlots], { axis: 0 }),
  };
}

/**
 * Attention of rows that all continue one prefix. The queries, packed as
 * [KV, g*N, hd], meet the prefix keys [KV, prefix, hd] in one MatMul with no
 * copy of the prefix per row; N is every real (unpadded) new token, or with
 * `lastOnly` each row's last token (the last layer: nothing reads the other
 * positions' outputs, only their keys and values). Each query's own-position
 * scores are appended to its prefix scores for one Softmax; the prefix
 * values are padded with zero rows over the own columns so one MatMul reads
 * the probabilities in place, and only the small own columns go back to
 * [KV, g, B, S, T] for the per-row values. Returns [B, S or 1, g, KV, hd].
 */
export function sharedPrefixAttention(
  gb: GraphBuilder,
  h: Heads,
  pastK: string,
  pastV: string,
  prefix: { k: string; v: string; len: string },
  pk: Packing,
  l: number,
  c: { g: number; hd: number; bias: string; lastOnly: boolean },
): string {
  const heads = gb.op1('Transpose', [h.rotated], { perm: [3, 2, 0, 1, 4] }); // [KV, slots, B, S, hd]
  const perKv = { perm: [1, 0, 2, 3] }; // [KV, B, S, hd] <-> [B, KV, S, hd]
  const k = gb.op1('Transpose', [gb.op1('Gather', [heads, gb.i64(c.g)], { axis: 1 })], perKv);
  const v = valuesOf(gb, h, heads, c.g + 1, 1, perKv.perm);
  const presentK = gb.op1('Concat', [pastK, k], { axis: 2 }, `present.${l}.key`); // [B, KV, T, hd]
  const presentV = gb.op1('Concat', [pastV, v], { axis: 2 }, `present.${l}.value`);
  const last = (x: string, axis: number) => gb.op1('Slice', [x, gb.i64([-1]), gb.i64([2 ** 62]), gb.i64([axis])]);
  let q = gb.op1('Slice', [heads, gb.i64([0]), gb.i64([c.g]), gb.i64([1])]); // [KV, g, B, S, hd]
  let bias = c.bias; // [B, S, T]
  if (c.lastOnly) {
    q = last(q, 3);
    bias = last(bias, 1);
  }
  // own positions: [KV, g, B, S, hd] x [KV, 1, B, hd, T]
  const kOwn = gb.op1('Unsqueeze', [gb.op1('Transpose', [presentK], { perm: [1, 0, 3, 2] }), gb.i64([1])]);
  const vOwn = gb.op1('Unsqueeze', [gb.op1('Transpose', [presentV], perKv), gb.i64([1])]);
  const ownScores = gb.op1('Add', [gb.op1('MatMul', [q, kOwn]), bias]); // [KV, g, B, S, T]
  const packRows = (x: string, slots: string, rows: string) =>
    c.lastOnly ? gb.op1('Reshape', [x, rows]) : gb.op1('Reshape', [gb.op1('Gather', [gb.op1('Reshape', [x, slots]), pk.index], { axis: 2 }), rows]);
  const unpackRows = (x: string, perHead: string, zero: string, like: string) =>
    c.lastOnly
      ? gb.op1('Reshape', [x, gb.op1('Shape', [like])])
      : gb.op1('Reshape', [gb.op1('Gather', [gb.op1('Concat', [gb.op1('Reshape', [x, perHead]), zero], { axis: 2 }), pk.slot], { axis: 2 }), gb.op1('Shape', [like])]);
  const qPacked = packRows(q, gb.i64([0, 0, -1, c.hd]), gb.i64([0, -1, c.hd])); // [KV, g*N, hd]
  const pkT = gb.op1('Transpose', [gb.op1('Squeeze', [prefix.k, gb.i64([0])])], { perm: [0, 2, 1] }); // [KV, hd, prefix]
  const pv = gb.op1('Squeeze', [prefix.v, gb.i64([0])]); // [KV, prefix, hd]
  const preScores = gb.op1('MatMul', [qPacked, pkT]); // [KV, g*N, prefix]
  const probs = softmaxNoDenormals(gb, gb.op1('Concat', [preScores, packRows(ownScores, pk.slotsT, pk.rowsT)], { axis: -1 })); // [KV, g*N, prefix + T]
  const preCtx = gb.op1('MatMul', [probs, gb.op1('Concat', [pv, pk.zeroPv], { axis: 1 })]); // [KV, g*N, hd]
  const ownProbs = gb.op1('Slice', [probs, prefix.len, gb.i64([2 ** 62]), gb.i64([-1])]); // [KV, g*N, T]
  const ownCtx = gb.op1('MatMul', [unpackRows(ownProbs, pk.perHeadT, pk.zeroT, ownScores), vOwn]); // [KV, g, B, S, hd]
  const ctx = gb.op1('Add', [unpackRows(preCtx, pk.perHeadHd, pk.zeroHd, q), ownCtx]);
  return gb.op1('Transpose', [ctx], { perm: [2, 3, 1, 0, 4] }); // [B, S, g, KV, hd]
}

/**
 * Attention of the slot-cache graph (`kvLayout: 'slots'`): the cache is the
 * worker's own buffer, fed as it lies ([B, KV, capacity, hd], the rows'
 * slots, no copy) and never written by the graph; the step's new keys and
 * values come out on their own (a few KiB) and the worker writes them into
 * the slots. So no step copies a row's past: neither a Concat into a present
 * nor a return of the whole cache to JavaScript (onnxruntime-node copies
 * every output it hands back).
 * `cacheBias` [B, 1, 1, capacity] hides the positions a row has not filled;
 * `newBias` [B, 1, g*S, S] is the causal mask among the new tokens (and the
 * rows' left padding); `probSplit` is [capacity, S], computed once per run.
 * A decode step at batch 1 costs mostly per-node dispatch, so this is as few
 * nodes as the layout allows (20 a layer without grouped heads): the fused
 * projection's columns are plain [q heads | k heads | v heads], one
 * Transpose and one Split give all three as [B, heads, S, hd], RoPE is
 * onnxruntime's RotaryEmbedding kernel on q and on k, and the probabilities
 * are split between the cache and the new tokens by one Split.
 * Returns the new keys and values [B, KV, S, hd] and the context as [B, S, H, hd].
 */
export function slotCacheAttention(
  gb: GraphBuilder,
  proj: string,
  cacheK: string,
  cacheV: string,
  c: { g: number; KV: number; hd: number; cacheBias: string; newBias: string; positionIds: string; probSplit: string },
): { k: string; v: string; ctx: string } {
  const H = c.g * c.KV;
  const heads = gb.op1('Transpose', [gb.op1('Reshape', [proj, gb.i64([0, 0, H + 2 * c.KV, c.hd])])], { perm: [0, 2, 1, 3] }); // [B, H + 2 KV, S, hd]
  const [q0, k0, v] = gb.op('Split', [heads, gb.i64([H, c.KV, c.KV])], { axis: 1 }, 3) as [string, string, string];
  // Interleaved pairs (llama2.c's RoPE); tables rope_cos_half / rope_sin_half [positions, hd / 2].
  const rope = (x: string) => gb.msOp1('RotaryEmbedding', [x, c.positionIds, 'rope_cos_half', 'rope_sin_half'], { interleaved: 1 });
  const k = rope(k0);
  // Query head h reads kv head floor(h / g): [B, H, S, hd] is [B, KV, g*S, hd] as it lies.
  const q = c.g > 1 ? gb.op1('Reshape', [rope(q0), gb.i64([0, c.KV, -1, c.hd])]) : rope(q0);
  const ctx = slotAttentionCore(gb, { q, k, v, cacheK, cacheV }, c);
  const perHead = c.g > 1 ? gb.op1('Reshape', [ctx, gb.i64([0, H, -1, c.hd])]) : ctx;
  return { k, v, ctx: gb.op1('Transpose', [perHead], { perm: [0, 2, 1, 3] }) };
}

/**
 * The slot-cache graph's attention after RoPE: q [B, KV, g*S, hd] over the cache [B, KV, C, hd]
 * and the step's own keys and values [B, KV, S, hd]; returns the context [B, KV, g*S, hd]. The
 * cache's scores and the new tokens' are concatenated for one Softmax and its probabilities split
 * again: a copy of the scores, which at a decode step (S = 1) is far smaller than a copy of the
 * cache's keys and values would be. A long prompt's step runs causalChunksAttention instead, in a
 * session of its own (runtime/long-steps.ts). onnxruntime's fused kernels lost to this form in the
 * whole graph: GroupQueryAttention over the cache in place 1.16-1.20x a step, MultiHeadAttention
 * with the cache as its past 1.12-1.26x (its CPU kernel reads a past only when asked for the
 * present, which it then copies every step; without it, it attends to the new tokens alone,
 * silently), the keys times the query 0.96-1.05x (bench/README.md, thirty-ninth and fortieth
 * sessions).
 */
export function slotAttentionCore(
  gb: GraphBuilder,
  t: { q: string; k: string; v: string; cacheK: string; cacheV: string },
  c: { cacheBias: string; newBias: string; probSplit: string },
): string {
  const kT = { perm: [0, 1, 3, 2] };
  const cacheScores = gb.op1('Add', [gb.op1('MatMul', [t.q, gb.op1('Transpose', [t.cacheK], kT)]), c.cacheBias]); // [B, KV, g*S, C]
  const newScores = gb.op1('Add', [gb.op1('MatMul', [t.q, gb.op1('Transpose', [t.k], kT)]), c.newBias]); // [B, KV, g*S, S]
  const probs = softmaxNoDenormals(gb, gb.op1('Concat', [cacheScores, newScores], { axis: -1 }));
  const [pCache, pNew] = gb.op('Split', [probs, c.probSplit], { axis: -1 }, 2) as [string, string];
  return gb.op1('Add', [gb.op1('MatMul', [pCache, t.cacheV]), gb.op1('MatMul', [pNew, t.v])]);
}

/**
 * slotAttentionCore for steps of one new token a row (runtime/one-token-graph.ts): q [B, KV, g, hd]
 * over the cache [B, KV, C, hd] and the row's own key and value [B, KV, 1, hd]; `probSplit` is
 * [capacity, 1]. The own key's score is one dot product a head and its value one scaled vector, so
 * they are a Mul and a ReduceSum, and a Mul, where the general form runs a MatMul for each (about
 * 3.5 us apiece at one row, against ~1 for an element-wise node: bench/README.md, fifty-first
 * session); a token sees itself, so there is no new-token bias to add. And no softmax floor: a
 * row's masked positions are MASK_VALUE below its scores, whose exp() is an exact 0, not a
 * denormal, and one row's few scores far below its max cost nothing that matters (the floor is for
 * a long prompt's squares of scores). Returns the context [B, KV, g, hd] as `output`.
 */
export function oneTokenAttentionCore(
  gb: GraphBuilder,
  t: { q: string; k: string; v: string; cacheK: string; cacheV: string },
  c: { cacheBias: string; probSplit: string },
  output?: string,
): string {
  const cacheScores = gb.op1('Add', [gb.op1('MatMul', [t.q, gb.op1('Transpose', [t.cacheK], { perm: [0, 1, 3, 2] })]), c.cacheBias]); // [B, KV, g, C]
  const ownScore = gb.op1('ReduceSum', [gb.op1('Mul', [t.q, t.k]), gb.i64([-1])], { keepdims: 1 }); // [B, KV, g, 1]
  const probs = gb.op1('Softmax', [gb.op1('Concat', [cacheScores, ownScore], { axis: -1 })], { axis: -1 });
  const [pCache, pOwn] = gb.op('Split', [probs, c.probSplit], { axis: -1 }, 2) as [string, string];
  return gb.op1('Add', [gb.op1('MatMul', [pCache, t.cacheV]), gb.op1('Mul', [pOwn, t.v])], {}, output);
}

/**
 * slotAttentionCore with the new tokens' queries in `chunks` pieces of about equal length, each
 * scoring the cache and only the new keys up to its own end (the causal mask's upper triangle is
 * not computed), the pieces' contexts concatenated again; `output` names the result. The same
 * answer to float32's rounding. A long prompt's step (a thousand tokens on an empty cache) holds a
 * score tensor per layer of heads x S x S floats (32 MB at m25's 8 heads), which spills the CPU's
 * caches several times over in the Concat, Softmax and Split; pieces of a quarter keep it a quarter.
 * At short steps the pieces' own nodes cost more than that saves (bench/attention-forms.ts), so
 * only a session for long steps runs this form (runtime/long-steps.ts).
 * `groups` query heads a key head (slotCacheAttention's g): q is then [B, KV, g*S, hd], each key
 * head's g groups of S rows one after the other, cut by token group by group; `newBias` is the
 * graph's [B, 1, S, S], repeated over the groups here.
 */
export function causalChunksAttention(
  gb: GraphBuilder,
  t: { q: string; k: string; v: string; cacheK: string; cacheV: string },
  c: { cacheBias: string; newBias: string },
  chunks: number,
  output?: string,
  groups = 1,
): string {
  const dim = (x: string, axis: number) => gb.op1('Slice', [gb.op1('Shape', [x]), gb.i64([axis]), gb.i64([axis + 1])]);
  // Grouped heads: [B, KV, g*S, hd] as [B, KV, g, S, hd] (`shapes.grouped`) and back (`shapes.flat`),
  // so that the pieces cut the token axis of every group alike.
  const hd = groups > 1 ? dim(t.q, 3) : undefined;
  const shapes = hd && { grouped: gb.op1('Concat', [gb.i64([0, 0, groups, -1]), hd], { axis: 0 }), flat: gb.op1('Concat', [gb.i64([0, 0, -1]), hd], { axis: 0 }) };
  const q = shapes ? gb.op1('Reshape', [t.q, shapes.grouped]) : t.q;
  const tokenAxis = shapes ? 3 : 2;
  const S = dim(q, tokenAxis);
  // Piece i holds queries [bounds[i], bounds[i + 1]): ceil(S / chunks) each, the last what is left.
  const per = gb.op1('Div', [gb.op1('Add', [S, gb.i64([chunks - 1])]), gb.i64([chunks])]);
  const bounds = gb.op1('Min', [gb.op1('Mul', [per, gb.i64([...Array(chunks + 1).keys()])]), S]);
  const at = (i: number) => gb.op1('Slice', [bounds, gb.i64([i]), gb.i64([i + 1])]);
  const sizes = gb.op1('Sub', [gb.op1('Slice', [bounds, gb.i64([1]), gb.i64([chunks + 1])]), gb.op1('Slice', [bounds, gb.i64([0]), gb.i64([chunks])])]);
  const parts = gb.op('Split', [q, sizes], { axis: tokenAxis }, chunks).map((piece, i) => {
    const [start, end] = [at(i), at(i + 1)];
    const upTo = (x: string) => gb.op1('Slice', [x, gb.i64([0]), end, gb.i64([2])]);
    const rows = gb.op1('Slice', [c.newBias, gb.op1('Concat', [start, gb.i64([0])], { axis: 0 }), gb.op1('Concat', [end, end], { axis: 0 }), gb.i64([2, 3])]);
    const probSplit = gb.op1('Concat', [dim(t.cacheK, 2), end], { axis: 0 });
    const core = (qq: string, bias: string) => slotAttentionCore(gb, { q: qq, k: upTo(t.k), v: upTo(t.v), cacheK: t.cacheK, cacheV: t.cacheV }, { cacheBias: c.cacheBias, newBias: bias, probSplit });
    if (!shapes) return core(piece, rows);
    // Each group's rows of the bias alike, as the graph tiles it (onnx-writer.ts).
    return gb.op1('Reshape', [core(gb.op1('Reshape', [piece, shapes.flat]), gb.op1('Tile', [rows, gb.i64([1, 1, groups, 1])])), shapes.grouped]);
  });
  if (!shapes) return gb.op1('Concat', parts, { axis: tokenAxis }, output);
  return gb.op1('Reshape', [gb.op1('Concat', parts, { axis: tokenAxis }), shapes.flat], {}, output);
}
