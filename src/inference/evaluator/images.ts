import { invalid, showValue } from '../../errors.js';
import { IMAGE_BYTES_MAX, IMAGES_TOTAL_BYTES_MAX } from '../protocol.js';

// Images arrive as base64 data: URLs. The declared media type is not trusted:
// the decoded bytes must start with the PNG, JPEG or WebP signature.

export type ImageFormat = 'png' | 'jpeg' | 'webp';

export interface DecodedImage {
  format: ImageFormat;
  bytes: number;
}

const DATA_URL_RE = /^data:([a-zA-Z0-9.+/-]*)((?:;[a-zA-Z0-9-]+=[^;,]*)*);base64,/;

function sniff(b: Buffer): ImageFormat | null {
  if (b.length >= 8 && b.readUInt32BE(0) === 0x89504e47 && b.readUInt32BE(4) === 0x0d0a1a0a) return 'png';
  if (b.length >= 3 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return 'jpeg';
  if (b.length >= 12 && b.toString('latin1', 0, 4) === 'RIFF' && b.toString('latin1', 8, 12) === 'WEBP') return 'webp';
  return null;
}

/** Exact decoded size of a base64 payload without decoding it. */
function decodedLength(b64: string): number {
  const pad = b64.endsWith('==') ? 2 : b64.endsWith('=') ? 1 : 0;
  return Math.floor((b64.length * 3) / 4) - pad;
}

export function validateImages(images: string[]): DecodedImage[] {
  let total = 0;
  return images.map((url, i) => {
    const param = `images.${i}`;
    if (/^https?:\/\//i.test(url)) throw invalid(param, 'remote image URLs are not accepted; send a base64 data: URL', url);
    const m = DATA_URL_RE.exec(url);
    if (!m) throw invalid(param, 'must be a base64 data: URL (data:image/png;base64,...)', url);
    const b64 = url.slice(m[0].length);
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(b64) || b64.length % 4 === 1) throw invalid(param, 'the data: URL payload is not valid base64', url);
    const bytes = decodedLength(b64);
    if (bytes > IMAGE_BYTES_MAX) throw invalid(param, `decodes to ${bytes} bytes, over the limit of ${IMAGE_BYTES_MAX} bytes per image`, `${showValue(url.slice(0, 40))}...`);
    total += bytes;
    if (total > IMAGES_TOTAL_BYTES_MAX) throw invalid('images', `images decode to more than ${IMAGES_TOTAL_BYTES_MAX} bytes together`, `${total} bytes`);
    // Only the head is needed to check the signature.
    const head = Buffer.from(b64.slice(0, 24), 'base64');
    const format = sniff(head);
    if (!format) throw invalid(param, `is not a PNG, JPEG or WebP image (declared ${m[1] || 'no type'}; checked by its bytes)`, `${url.slice(0, 40)}...`);
    return { format, bytes };
  });
}
