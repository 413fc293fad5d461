'use strict';
// A Node.js client of the tiled compile daemon: the Compiler service of
// proto/tiled/v1/compile.proto over @grpc/grpc-js. The protos are loaded at run time from the
// repository's proto/ folder, so there is no generated code to keep in step with them.
//
//   const { TiledClient } = require('./tiled_client');
//   const client = new TiledClient('unix:///run/tiled.sock');
//   const { response, artifact } = await client.compile(programBytes, { target: 'cpu' });
//
// Every call carries a deadline (`timeoutS`). Failures reject with a TiledClientError: `code`
// and `codeName` are the gRPC status for an RPC error ("INVALID_ARGUMENT", ...; compile.proto
// lists what each means), and 'ARTIFACT_MISMATCH' when the bytes received are not the blob the
// daemon named. An artifact that fails its sha256 check is never returned.

const crypto = require('node:crypto');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = path.resolve(__dirname, '..', '..', 'proto');
const DEFAULT_TIMEOUT_S = 600;
// The daemon's Unix socket or a host on the LAN: a proxy from the environment would be wrong.
const CHANNEL_OPTIONS = { 'grpc.enable_http_proxy': 0 };

class TiledClientError extends Error {
  constructor(codeName, details, code = null) {
    super(`${codeName}: ${details}`);
    this.name = 'TiledClientError';
    this.code = code;
    this.codeName = codeName;
    this.details = details;
  }

  static fromRpc(err) {
    return new TiledClientError(grpc.status[err.code] || `UNKNOWN(${err.code})`,
                                err.details || err.message, err.code);
  }
}

function sha256Hex(data) {
  return crypto.createHash('sha256').update(data).digest('hex');
}

function varint(n) {
  const out = [];
  for (; n >= 0x80; n = Math.floor(n / 128)) out.push((n % 128) | 0x80);
  out.push(n);
  return Buffer.from(out);
}

// The program travels as the caller's bytes, untouched (a Tile IR file is
// `Program.to_bytes()`, the wire form of tiled.v1.Program). A protobuf message is a
// concatenation of fields in any order, so CompileRequest's field 1 (`program`, length-delimited:
// tag 0x0a) is written here and proto-loader encodes the other fields after it. Decoding the file
// into a JS object and encoding it again would drop the fields this copy of the protos does not
// know (a newer schema) and need not give the same bytes; the daemon decodes and verifies the
// program either way, and answers INVALID_ARGUMENT for one that does not verify.
function compileRequestSerializer(encodeFields) {
  return ({ program, ...fields }) => Buffer.concat([
    Buffer.from([0x0a]), varint(program.length), program, encodeFields(fields)]);
}

function loadCompilerService(protoDir = PROTO_DIR) {
  const definition = protoLoader.loadSync('tiled/v1/compile.proto', {
    includeDirs: [protoDir], keepCase: true, longs: Number, enums: String, bytes: Buffer,
    defaults: true,
  });
  const service = definition['tiled.v1.Compiler'];
  const compile = { ...service.Compile,
                    requestSerialize: compileRequestSerializer(service.Compile.requestSerialize) };
  return { ...service, Compile: compile };
}

// Reassembles GetArtifact chunks; throws on a gap, an overlap, a size that disagrees, or bytes
// whose sha256 is not the one asked for.
class ChunkAssembler {
  constructor(sha256) {
    this.sha256 = sha256;
    this.parts = [];
    this.size = 0;
    this.total = null;
  }

  add(chunk) {
    const where = `artifact ${this.sha256.slice(0, 12)}`;
    if (chunk.offset !== this.size) {
      throw new TiledClientError('ARTIFACT_MISMATCH',
                                 `${where}: chunk at offset ${chunk.offset}, expected ${this.size}`);
    }
    if (this.total !== null && chunk.total_size !== this.total) {
      throw new TiledClientError('ARTIFACT_MISMATCH', `${where}: total size changed mid-stream`);
    }
    this.total = chunk.total_size;
    this.parts.push(chunk.data);
    this.size += chunk.data.length;
  }

  result() {
    const data = Buffer.concat(this.parts);
    const where = `artifact ${this.sha256.slice(0, 12)}`;
    if (this.total !== null && data.length !== this.total) {
      throw new TiledClientError('ARTIFACT_MISMATCH',
                                 `${where}: got ${data.length} bytes of ${this.total}`);
    }
    const digest = sha256Hex(data);
    if (digest !== this.sha256) {
      throw new TiledClientError('ARTIFACT_MISMATCH', `${where}: received bytes have sha256 ${digest}`);
    }
    return data;
  }
}

// `data` when it is the blob that both the response and its manifest name; throws otherwise.
function checkArtifact(data, response) {
  let manifest;
  try {
    manifest = JSON.parse(response.manifest_json);
  } catch (e) {
    throw new TiledClientError('ARTIFACT_MISMATCH', `manifest_json is not JSON: ${e.message}`);
  }
  const digest = sha256Hex(data);
  const named = [['response', response.artifact_sha256], ['manifest', manifest.artifact_sha256]];
  for (const [what, want] of named) {
    if (digest !== want) {
      throw new TiledClientError('ARTIFACT_MISMATCH',
        `artifact has sha256 ${digest} (${data.length} bytes), but the ${what} names ${want}`);
    }
  }
  if (data.length !== response.artifact_size) {
    throw new TiledClientError('ARTIFACT_MISMATCH',
      `artifact is ${data.length} bytes, but the response says ${response.artifact_size}`);
  }
  return data;
}

class TiledClient {
  // `address`: "unix:///path/to/tiled.sock" or "host:port" (default TILED_SERVER).
  constructor(address = process.env.TILED_SERVER, { timeoutS = DEFAULT_TIMEOUT_S,
    protoDir = PROTO_DIR, credentials = grpc.credentials.createInsecure() } = {}) {
    if (!address) {
      throw new TiledClientError('NO_SERVER',
                                 'no daemon address: pass one or set TILED_SERVER (unix:///path or host:port)');
    }
    const Compiler = grpc.makeGenericClientConstructor(loadCompilerService(protoDir),
                                                       'tiled.v1.Compiler');
    this.address = address;
    this.timeoutS = timeoutS;
    this.stub = new Compiler(address, credentials, CHANNEL_OPTIONS);
  }

  _options() {
    return { deadline: Date.now() + this.timeoutS * 1000 };
  }

  _unary(method, request) {
    return new Promise((resolve, reject) => {
      this.stub[method](request, this._options(), (err, response) => {
        if (err) reject(TiledClientError.fromRpc(err));
        else resolve(response);
      });
    });
  }

  // The daemon's CompileResponse for `program` (a Buffer of Program bytes), unchecked.
  compileRaw(program, { target = 'local', options = null, inlineLimit = 0, cacheOnly = false } = {}) {
    return this._unary('Compile', {
      program, target, options_json: options ? JSON.stringify(options) : '',
      inline_limit: inlineLimit, cache_only: cacheOnly,
    });
  }

  // { response, artifact }: the artifact inlined in the response or, when it was over the inline
  // limit, fetched with GetArtifact; checked against the response and the manifest either way.
  async compile(program, opts = {}) {
    const response = await this.compileRaw(program, opts);
    const inlined = response.artifact.length > 0 || response.artifact_size === 0;
    const data = inlined ? response.artifact : await this.getArtifact(response.artifact_sha256);
    return { response, artifact: checkArtifact(data, response) };
  }

  // The blob `sha256`, streamed in chunks of `chunkBytes` (0: the daemon's default) and checked.
  getArtifact(sha256, { chunkBytes = 0 } = {}) {
    return new Promise((resolve, reject) => {
      const assembler = new ChunkAssembler(sha256);
      const stream = this.stub.GetArtifact({ sha256, chunk_bytes: chunkBytes }, this._options());
      let failed = false;
      const fail = (err) => {
        if (!failed) reject(err);
        failed = true;
      };
      stream.on('data', (chunk) => {
        try {
          assembler.add(chunk);
        } catch (e) {
          fail(e);
          stream.cancel();
        }
      });
      stream.on('error', (err) => fail(TiledClientError.fromRpc(err)));
      stream.on('end', () => {
        if (failed) return;
        try {
          resolve(assembler.result());
        } catch (e) {
          fail(e);
        }
      });
    });
  }

  capabilities() {
    return this._unary('Capabilities', {});
  }

  close() {
    this.stub.close();
  }
}

module.exports = { TiledClient, TiledClientError, checkArtifact, loadCompilerService, sha256Hex };
