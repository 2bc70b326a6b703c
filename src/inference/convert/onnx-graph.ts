// A very small ONNX graph builder over the `onnx-proto` protobuf bindings.
import onnxProto from 'onnx-proto';
import type { onnx as P } from 'onnx-proto';

export const onnx = onnxProto.onnx;
export type DType = 'float32' | 'float16' | 'uint8' | 'int8' | 'int64' | 'bool';

const DTYPE: Record<DType, number> = {
  float32: onnx.TensorProto.DataType.FLOAT,
  float16: onnx.TensorProto.DataType.FLOAT16,
  uint8: onnx.TensorProto.DataType.UINT8,
  int8: onnx.TensorProto.DataType.INT8,
  int64: onnx.TensorProto.DataType.INT64,
  bool: onnx.TensorProto.DataType.BOOL,
};

/** onnxruntime's contrib operators (MatMulNBits) live in this domain, version 1. */
export const MS_DOMAIN = 'com.microsoft';

export type Dim = number | string;
export type AttrValue = number | number[] | string | { float: number } | { floats: number[] };

interface Initializer {
  name: string;
  dtype: DType;
  dims: number[];
  bytes: Uint8Array;
}

type InitData = Float32Array | BigInt64Array | Uint8Array | Int8Array | Uint16Array;

/** A typed array's bytes, no copy (what an initializer's raw_data holds). */
export function bytesOf(data: ArrayBufferView): Uint8Array {
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

export class GraphBuilder {
  readonly nodes: P.INodeProto[] = [];
  readonly initializers: Initializer[] = [];
  readonly inputs: P.IValueInfoProto[] = [];
  readonly outputs: P.IValueInfoProto[] = [];
  private counter = 0;
  private constCache = new Map<string, string>();

  fresh(prefix: string): string {
    return `${prefix}_${this.counter++}`;
  }

  input(name: string, dtype: DType, shape: Dim[]): string {
    this.inputs.push(valueInfo(name, dtype, shape));
    return name;
  }

  output(name: string, dtype: DType, shape: Dim[]): void {
    this.outputs.push(valueInfo(name, dtype, shape));
  }

  /** Add a weight / table initializer. */
  /** float16 data comes as the half-precision bits in a Uint16Array. */
  init(name: string, dims: number[], data: InitData, dtype: DType = 'float32'): string {
    const n = dims.reduce((a, b) => a * b, 1);
    const elems = dtype === 'bool' ? data.byteLength : data.length;
    if (n !== elems) throw new Error(`initializer ${name}: dims ${dims} hold ${n} values, data has ${elems}`);
    this.initializers.push({ name, dtype, dims, bytes: bytesOf(data) });
    return name;
  }

  /** Shared small constants (int64 vectors / scalars, float scalars). */
  i64(values: number[] | number, name?: string): string {
    const scalar = !Array.isArray(values);
    const arr = scalar ? [values] : values;
    const key = `i64:${scalar ? 's' : 'v'}:${arr.join(',')}`;
    const hit = this.constCache.get(key);
    if (hit) return hit;
    const nm = name ?? this.fresh(scalar ? 'const_i64' : 'const_i64v');
    this.init(nm, scalar ? [] : [arr.length], BigInt64Array.from(arr.map((v) => BigInt(v))), 'int64');
    this.constCache.set(key, nm);
    return nm;
  }

  f32(value: number, name?: string): string {
    const key = `f32:${value}`;
    const hit = this.constCache.get(key);
    if (hit) return hit;
    const nm = name ?? this.fresh('const_f32');
    this.init(nm, [], Float32Array.of(value));
    this.constCache.set(key, nm);
    return nm;
  }

  private usesMsDomain = false;

  /** Append a node; returns its output names. */
  op(opType: string, inputs: string[], attrs: Record<string, AttrValue> = {}, outputs: number | string[] = 1, name?: string, domain?: string): string[] {
    const outs = typeof outputs === 'number' ? Array.from({ length: outputs }, () => this.fresh(opType.toLowerCase())) : outputs;
    if (domain === MS_DOMAIN) this.usesMsDomain = true;
    else if (domain) throw new Error(`op ${opType}: unsupported domain ${domain}`);
    this.nodes.push({
      opType,
      ...(domain ? { domain } : {}),
      name: name ?? this.fresh(`n_${opType}`),
      input: inputs,
      output: outs,
      attribute: Object.entries(attrs).map(([k, v]) => attribute(k, v)),
    });
    return outs;
  }

  /** Single-output convenience. */
  op1(opType: string, inputs: string[], attrs: Record<string, AttrValue> = {}, output?: string): string {
    return this.op(opType, inputs, attrs, output ? [output] : 1)[0]!;
  }

  /** A single-output onnxruntime contrib op (com.microsoft domain). */
  msOp1(opType: string, inputs: string[], attrs: Record<string, AttrValue> = {}, output?: string): string {
    return this.op(opType, inputs, attrs, output ? [output] : 1, undefined, MS_DOMAIN)[0]!;
  }

  totalInitializerBytes(): number {
    return this.initializers.reduce((a, t) => a + t.bytes.byteLength, 0);
  }

  /**
   * Encode to a ModelProto. With `externalDataFile`, weight tensors (float, float16, uint8) of at least
   * `externalThreshold` bytes go to that file (returned as `data`), the ONNX
   * external-data layout onnxruntime reads from beside the model.
   */
  encode(opts: {
    graphName: string;
    opset: number;
    producer: string;
    docString?: string;
    metadata?: Record<string, string>;
    externalDataFile?: string;
    externalThreshold?: number;
  }): { model: Uint8Array; data?: Uint8Array } {
    const tensors: P.ITensorProto[] = [];
    const dataChunks: Uint8Array[] = [];
    let dataLen = 0;
    const threshold = opts.externalThreshold ?? 1024;
    for (const t of this.initializers) {
      const tp: P.ITensorProto = { name: t.name, dims: t.dims, dataType: DTYPE[t.dtype] };
      if (opts.externalDataFile && t.dtype !== 'int64' && t.dtype !== 'bool' && t.bytes.byteLength >= threshold) {
        const pad = (64 - (dataLen % 64)) % 64; // keep tensors aligned for mmap
        if (pad) {
          dataChunks.push(new Uint8Array(pad));
          dataLen += pad;
        }
        tp.dataLocation = onnx.TensorProto.DataLocation.EXTERNAL;
        tp.externalData = [
          { key: 'location', value: opts.externalDataFile },
          { key: 'offset', value: String(dataLen) },
          { key: 'length', value: String(t.bytes.byteLength) },
        ];
        dataChunks.push(t.bytes);
        dataLen += t.bytes.byteLength;
      } else {
        tp.rawData = t.bytes;
      }
      tensors.push(tp);
    }
    const graph: P.IGraphProto = {
      name: opts.graphName,
      node: this.nodes,
      initializer: tensors,
      input: this.inputs,
      output: this.outputs,
    };
    const model: P.IModelProto = {
      irVersion: 8,
      producerName: opts.producer,
      producerVersion: '1',
      docString: opts.docString ?? '',
      opsetImport: [{ domain: '', version: opts.opset }, ...(this.usesMsDomain ? [{ domain: MS_DOMAIN, version: 1 }] : [])],
      graph,
      metadataProps: Object.entries(opts.metadata ?? {}).map(([key, value]) => ({ key, value })),
    };
    const bytes = onnx.ModelProto.encode(model).finish();
    if (!opts.externalDataFile) return { model: bytes };
    const data = new Uint8Array(dataLen);
    let off = 0;
    for (const c of dataChunks) {
      data.set(c, off);
      off += c.byteLength;
    }
    return { model: bytes, data };
  }
}

function valueInfo(name: string, dtype: DType, shape: Dim[]): P.IValueInfoProto {
  return {
    name,
    type: {
      tensorType: {
        elemType: DTYPE[dtype],
        shape: { dim: shape.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) },
      },
    },
  };
}

function attribute(name: string, v: AttrValue): P.IAttributeProto {
  const T = onnx.AttributeProto.AttributeType;
  if (typeof v === 'number') {
    if (!Number.isInteger(v)) throw new Error(`attribute ${name}: use {float} for non-integers`);
    return { name, type: T.INT, i: v };
  }
  if (typeof v === 'string') return { name, type: T.STRING, s: new TextEncoder().encode(v) };
  if (Array.isArray(v)) return { name, type: T.INTS, ints: v };
  if ('float' in v) return { name, type: T.FLOAT, f: v.float };
  return { name, type: T.FLOATS, floats: v.floats };
}
