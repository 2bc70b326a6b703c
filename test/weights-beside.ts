import fs from 'node:fs';
import path from 'node:path';
import onnxProto from 'onnx-proto';

/**
 * The model file `file` rewritten with its initializers of at least `minBytes` in `data` beside it
 * (ONNX external data, as every model past 2 GB keeps its weights, and the optimum exporters most).
 */
export function weightsBeside(file: string, data: string, minBytes = 1024): void {
  const { onnx } = onnxProto;
  const model = onnx.ModelProto.decode(fs.readFileSync(file));
  const chunks: Uint8Array[] = [];
  let offset = 0;
  for (const t of model.graph!.initializer!) {
    if (!t.rawData || t.rawData.length < minBytes) continue;
    t.dataLocation = onnx.TensorProto.DataLocation.EXTERNAL;
    t.externalData = [
      { key: 'location', value: path.relative(path.dirname(file), data) },
      { key: 'offset', value: String(offset) },
      { key: 'length', value: String(t.rawData.length) },
    ];
    chunks.push(t.rawData);
    offset += t.rawData.length;
    t.rawData = new Uint8Array(0);
  }
  fs.writeFileSync(data, Buffer.concat(chunks));
  fs.writeFileSync(file, onnx.ModelProto.encode(model).finish());
}
