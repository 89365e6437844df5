#!/bin/bash
echo $(( $1 - $2 ))
