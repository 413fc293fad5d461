#!/usr/bin/env node
'use strict';
// Compiles one Tile IR program file on the tiled daemon and checks the artifact end to end:
// its sha256 must equal the response's artifact_sha256 and the manifest's, and the same blob
// re-fetched with GetArtifact (streamed) must have that digest too. Prints one JSON line:
//   {"action_key":"…","artifact_sha256":"…","size":12345,"cache_hit":false}
// Exits 1 on an RPC error (its gRPC status name and details go to stderr) or any mismatch,
// 2 on a usage error.
//
//   node compile.js --server unix:///tmp/tiled.sock testdata/vadd.tir

const fs = require('node:fs');
const { parseArgs } = require('node:util');
const { TiledClient, TiledClientError } = require('./tiled_client');

const USAGE = 'usage: node compile.js [--server unix:///path|host:port] [--target cpu] ' +
              '[--timeout SECONDS] [--chunk-bytes N] PROGRAM.tir\n' +
              '  --server defaults to $TILED_SERVER';

function parse(argv) {
  const { values, positionals } = parseArgs({
    args: argv, allowPositionals: true,
    options: {
      server: { type: 'string', default: process.env.TILED_SERVER || '' },
      target: { type: 'string', default: 'cpu' },
      timeout: { type: 'string', default: '600' },
      'chunk-bytes': { type: 'string', default: '0' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  const timeoutS = Number(values.timeout);
  const chunkBytes = Number(values['chunk-bytes']);
  if (values.help || positionals.length !== 1 || !values.server || !(timeoutS > 0) ||
      !Number.isInteger(chunkBytes) || chunkBytes < 0) {
    return null;
  }
  return { file: positionals[0], server: values.server, target: values.target, timeoutS,
           chunkBytes };
}

async function run(args) {
  const program = fs.readFileSync(args.file);
  const client = new TiledClient(args.server, { timeoutS: args.timeoutS });
  try {
    const { response, artifact } = await client.compile(program, { target: args.target });
    // getArtifact checks the streamed bytes against the digest it asked for.
    const fetched = await client.getArtifact(response.artifact_sha256,
                                             { chunkBytes: args.chunkBytes });
    if (!fetched.equals(artifact)) {
      throw new TiledClientError('ARTIFACT_MISMATCH',
                                 'GetArtifact returned other bytes than Compile');
    }
    return { action_key: response.action_key, artifact_sha256: response.artifact_sha256,
             size: artifact.length, cache_hit: response.cache_hit };
  } finally {
    client.close();
  }
}

async function main() {
  let args;
  try {
    args = parse(process.argv.slice(2));
  } catch (e) {
    args = null;
    console.error(`compile.js: ${e.message}`);
  }
  if (args === null) {
    console.error(USAGE);
    process.exitCode = 2;
    return;
  }
  try {
    console.log(JSON.stringify(await run(args)));
  } catch (e) {
    console.error(`compile.js: ${args.file} on ${args.server}: ${e.message}`);
    process.exitCode = 1;
  }
}

main();
